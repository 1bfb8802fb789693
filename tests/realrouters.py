"""Drivers for the real routers the differential tests run beside kvsim's models: fake SGLang
workers on 127.0.0.1 that hold each request open until the test releases it, the SGLang Model
Gateway binary (``smg`` wheel) started and stopped by its pid, and helpers that render token
ids as text.

Rendering: token ``t`` becomes four characters, the first unique to the token (U+4E00 + t, then
U+20000 on), so
the character prefix two prompts share is exactly four times their shared token prefix.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHARS_PER_TOKEN = 4
BMP_TOKENS = 0x9FFF - 0x4E00 + 1  # CJK Unified Ideographs, then CJK Extension B
MAX_TOKENS = BMP_TOKENS + 0x2A6DF - 0x20000 + 1
WAIT_S = 10.0  # bound on every wait for the real router


def _first_char(t: int) -> str:
    if not 0 <= t < MAX_TOKENS:
        raise ValueError(f"token {t} has no character of its own")
    return chr(0x4E00 + t) if t < BMP_TOKENS else chr(0x20000 + t - BMP_TOKENS)


def render(tokens) -> str:
    """Token ids as text: four characters per token, the first unique to the token."""
    return "".join(_first_char(int(t)) + "abc" for t in tokens)


def free_port() -> int:
    """A port the OS has just handed out on 127.0.0.1 (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, what: str, timeout: float = WAIT_S, step: float = 0.005):
    """Poll ``predicate`` until it returns a truthy value (returned), at most ``timeout`` s."""
    end = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class FakeWorker:
    """One SGLang worker as the gateway sees it over HTTP: answers the probes, records each
    ``/generate`` (its ``rid``) and holds it open until ``release(rid)``."""

    def __init__(self, index: int, arrivals: dict, lock: threading.Lock) -> None:
        self.index = index
        self.held: dict[str, threading.Event] = {}
        self.done: set[str] = set()
        worker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _json(self, code: int, obj) -> None:
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/health":
                    return self._json(200, {})
                if path in ("/model_info", "/get_model_info", "/server_info"):
                    return self._json(200, {"model_path": "fake", "tokenizer_path": "fake",
                                            "is_generation": True})
                if path == "/v1/models":
                    return self._json(200, {"object": "list",
                                            "data": [{"id": "fake", "object": "model"}]})
                return self._json(404, {"error": "not served"})  # /loads, /metrics

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                rid = str(body.get("rid", ""))
                ev = threading.Event()
                with lock:
                    worker.held[rid] = ev
                    arrivals[rid] = worker.index
                ev.wait(60)
                self._json(200, {"text": "ok", "meta_info": {
                    "id": rid, "prompt_tokens": 1, "completion_tokens": 1,
                    "finish_reason": {"type": "stop"}}})
                with lock:
                    worker.done.add(rid)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def release_all(self) -> None:
        for ev in list(self.held.values()):
            ev.set()

    def stop(self) -> None:
        self.release_all()
        self.server.shutdown()
        self.server.server_close()


class FakeFleet:
    """``n`` fake workers; ``arrivals`` maps each request id to the worker that received it."""

    def __init__(self, n: int) -> None:
        self.lock = threading.Lock()
        self.arrivals: dict[str, int] = {}
        self.workers = [FakeWorker(i, self.arrivals, self.lock) for i in range(n)]

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def release(self, rid: str) -> int:
        """Let request ``rid`` finish; returns its worker."""
        w = self.workers[self.arrivals[rid]]
        w.held[rid].set()
        wait_until(lambda: rid in w.done, f"worker {w.index} to answer {rid}")
        return w.index

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


def smg_binary() -> str:
    """The ``smg`` entry point of the running interpreter's environment."""
    here = Path(sys.executable).parent / "smg"
    found = str(here) if here.is_file() else shutil.which("smg")
    if not found:
        raise RuntimeError("the smg wheel is not installed (make test installs smg==1.13.0)")
    return found


class Gateway:
    """The real SMG gateway (``smg launch --policy cache_aware``) in front of ``fleet``,
    started by its pid, ``stop()``ped by it (SIGTERM, then SIGKILL after a short grace)."""

    def __init__(self, fleet: FakeFleet, log: Path, *extra: str) -> None:
        self.fleet = fleet
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [smg_binary(), "launch", "--policy", "cache_aware", "--host", "127.0.0.1",
               "--port", str(self.port), "--prometheus-host", "127.0.0.1",
               "--prometheus-port", str(free_port()), "--log-level", "warn",
               *extra, "--worker-urls", *fleet.urls]
        self.log = open(log, "w")  # noqa: SIM115  closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []
        try:
            wait_until(lambda: len(self.ready_urls()) == len(fleet.workers),
                       "the gateway to register every worker", timeout=30.0, step=0.05)
        except BaseException:
            self.stop()
            raise

    def log_text(self) -> str:
        """What the gateway has logged so far."""
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def _get(self, path: str):
        if self.proc.poll() is not None:
            raise RuntimeError(f"smg exited with {self.proc.returncode}")
        try:
            with urllib.request.urlopen(self.base + path, timeout=2) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def ready_urls(self) -> list[str]:
        doc = self._get("/workers")
        if not doc:
            return []
        return [w["url"] for w in doc.get("workers", [])
                if w.get("status") == "ready" and w.get("is_healthy")]

    def loads(self) -> list[int] | None:
        """The gateway's own per-worker load, in fleet order."""
        doc = self._get("/workers")
        if not doc:
            return None
        by_url = {w["url"]: int(w.get("load", 0)) for w in doc.get("workers", [])}
        return [by_url.get(u, -1) for u in self.fleet.urls]

    def send(self, rid: str, text: str) -> int:
        """POST ``text`` as request ``rid`` (held open by its worker) and return the worker
        the gateway chose."""
        body = json.dumps({"text": text, "rid": rid,
                           "sampling_params": {"max_new_tokens": 1}}).encode()

        def post() -> None:
            req = urllib.request.Request(self.base + "/generate", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=90) as r:
                    r.read()
            except Exception as e:  # reported by the test through self.errors
                self.errors.append(f"{rid}: {type(e).__name__}: {e}")

        t = threading.Thread(target=post, daemon=True)
        t.start()
        self.threads.append(t)
        wait_until(lambda: rid in self.fleet.arrivals or self.errors, f"request {rid} to arrive")
        if rid not in self.fleet.arrivals:
            raise RuntimeError(f"the gateway refused {rid}: {self.errors}")
        return self.fleet.arrivals[rid]

    def stop(self) -> None:
        for w in self.fleet.workers:  # let every held request end before the gateway does
            w.release_all()
        for t in self.threads:
            t.join(5.0)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5.0)
            except ProcessLookupError:
                pass
        self.fleet.stop()
        self.log.close()


# --- Dynamo's selector ------------------------------------------------------------------------
def vllm_event_encoders():
    """vLLM's KV event wire format (vllm/distributed/kv_events.py 0.33: msgpack of
    ``KVEventBatch``, tagged ``BlockStored`` / ``BlockRemoved``), the fields it always sends."""
    import msgspec

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list
        parent_block_hash: int | None
        token_ids: list
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list
        medium: str | None

    return EventBatch, BlockStored, BlockRemoved, msgspec.msgpack.Encoder()


class FakeEngine:
    """One engine's KV cache as its events tell it: an LRU of blocks (``capacity`` blocks),
    head first within a prompt, so an evicted parent can leave its children cached (the case
    Dynamo's index drops). ``prefill`` returns the events it publishes: ("stored", parent,
    run) and ("removed", run)."""

    def __init__(self, capacity: int) -> None:
        from collections import OrderedDict

        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def prefill(self, ids) -> list[tuple]:
        events: list[tuple] = []
        run: list[int] = []
        parent = None
        prev = None
        for b in ids:
            b = int(b)
            if b in self.blocks:
                if run:
                    events.append(("stored", parent, run))
                    run = []
                self.blocks.move_to_end(b)
            else:
                if not run:
                    parent = prev
                run.append(b)
                self.blocks[b] = None
            prev = b
        if run:
            events.append(("stored", parent, run))
        gone = []
        while len(self.blocks) > self.capacity:
            gone.append(self.blocks.popitem(last=False)[0])
        if gone:
            events.append(("removed", gone))
        return events


class DynamoPublisher:
    """One ZMQ PUB socket per worker on 127.0.0.1 (Dynamo's listener connects to it),
    sending vLLM-format event batches."""

    def __init__(self, n: int) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.socks = []
        self.ports = []
        for _ in range(n):
            s = self.ctx.socket(zmq.PUB)
            s.setsockopt(zmq.LINGER, 0)
            self.ports.append(s.bind_to_random_port("tcp://127.0.0.1"))
            self.socks.append(s)
        self.seq = [0] * n
        self.batch, self.stored, self.removed, self.enc = vllm_event_encoders()

    def publish(self, worker: int, events, tokens_of, block: int) -> None:
        out = []
        for ev in events:
            if ev[0] == "stored":
                _, parent, run = ev
                toks = [t for b in run for t in tokens_of[b]]
                out.append(self.stored(block_hashes=run, parent_block_hash=parent,
                                       token_ids=toks, block_size=block, lora_id=None,
                                       medium="GPU", lora_name=None))
            else:
                out.append(self.removed(block_hashes=ev[1], medium="GPU"))
        if not out:
            return
        payload = self.enc.encode(self.batch(ts=time.time(), events=out))
        self.socks[worker].send_multipart([b"", self.seq[worker].to_bytes(8, "big"), payload])
        self.seq[worker] += 1

    def close(self) -> None:
        for s in self.socks:
            s.close(0)
        self.ctx.term()
