"""Executors: where the runs of a sweep (or of a study, ``kvsim reproduce``) execute.

An executor maps ``fn(cfg, arg, get_trace)`` over jobs ``(cfg, arg)`` and yields ``(index,
result)`` in completion order; ``get_trace()`` returns the config's trace (loading it, or
fetching it, the first time a worker needs it, so ``fn`` sees a load error as its own). An
executor decides only where and when a job runs; a job's result is a pure function of its
config and trace, so every executor gives identical results:

- ``SerialExecutor``: in this process, in order;
- ``LocalPoolExecutor(jobs)``: a pool of ``jobs`` processes on this machine;
- ``RayExecutor(address)``: Ray tasks on a local Ray or an existing cluster.

Traces: a worker process loads each trace once and keeps it for later jobs (``sim.run.trace``
memoizes by the loading options; the on-disk npz cache makes that load fast). The Ray executor
loads each distinct trace once in the driver and puts it in Ray's object store; a worker
fetches it the first time it runs a job on that trace and keeps it, so nodes need no copy of
the trace files.

Failures: a worker that dies (killed, out of memory) fails only the jobs it was running; they
run again, up to ``max_retries`` times, while the other jobs go on (Ray: task retries; local
pool: the jobs a broken pool lost run again one per process, and only the job whose own
worker died is charged). An exception raised BY a job is not retried (it
would fail again): it reaches the caller.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol

from costmodel.registry import Registry
from sim.config import RunConfig

DEFAULT_RETRIES = 3

Job = tuple[RunConfig, Any]
GetTrace = Callable[[], Any]
JobFn = Callable[[RunConfig, Any, GetTrace], Any]


class WorkerLostError(RuntimeError):
    """A job's worker died more than ``max_retries`` times."""

    exit_code = 1


@dataclass(frozen=True)
class ExecutorSpec:
    """What the user asked for (CLI options over the sweep YAML's ``executor:``)."""

    kind: str = "local"  # local | ray
    jobs: int = 1  # local: processes (1 = this process); ray: tasks in flight (0 = no cap)
    address: str | None = None  # ray: None = start a local Ray; "auto" or "ray://HOST:PORT"
    max_retries: int = DEFAULT_RETRIES

    def make(self) -> Executor:
        return EXECUTORS.get(self.kind)(self)


class Executor(Protocol):
    name: str

    def map(self, fn: JobFn, jobs: list[Job]) -> Iterator[tuple[int, Any]]:
        """``(index, fn(cfg, arg, get_trace))`` for every job, in completion order."""
        ...

    def close(self) -> None: ...


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _local_call(fn: JobFn, cfg: RunConfig, arg: Any) -> Any:
    from sim.run import load_run_trace

    return fn(cfg, arg, lambda: load_run_trace(cfg))


class SerialExecutor:
    name = "serial"

    def map(self, fn: JobFn, jobs: list[Job]) -> Iterator[tuple[int, Any]]:
        for i, (cfg, arg) in enumerate(jobs):
            yield i, _local_call(fn, cfg, arg)

    def close(self) -> None:
        pass


PARENT_POLL_S = 0.5


def _exit_with_parent(parent: int) -> None:
    """Pool initializer: a daemon thread ends this worker once its parent is gone (killed
    with SIGKILL, the parent cannot stop its pool; the worker would run on, orphaned). Ctrl-C
    (SIGINT to the terminal's whole process group) is the parent's to handle: it stops the
    workers itself (``_stop_workers``), so a worker ignores it rather than die mid-point and
    have its points run again."""
    import signal
    import threading
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="kvsim-parent-watch", daemon=True).start()


def _stop_workers(pools: list[ProcessPoolExecutor]) -> None:
    """Interrupted (Ctrl-C, or the caller stopped iterating): drop the queued jobs and end
    the running ones now, instead of waiting for them as leaving a pool does. The pools'
    workers are this process's only multiprocessing children."""
    import multiprocessing

    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)
    for child in multiprocessing.active_children():
        child.terminate()


class LocalPoolExecutor:
    """``jobs`` processes; a job whose process died runs again in a fresh pool. A worker
    exits by itself when the process that made the pool dies (``_exit_with_parent``).

    The pool outlives one ``map``: later maps (a plan's rounds) reuse its workers, with the
    traces they loaded and their imports, until ``close`` (issue 55: a 6-round plan once
    started and loaded everything 6 times per worker). A pool that broke or was stopped is
    not reused.

    A dying worker breaks the whole ``ProcessPoolExecutor``: every job still pending in it
    fails with ``BrokenProcessPool``, not only the dead worker's. So a loss in a shared pool
    charges nobody: the lost jobs run again one per single-process pool (``jobs`` of them at
    a time), where a broken pool names its job. Only a job whose own worker died is charged a
    try; the others complete."""

    name = "local"

    def __init__(self, workers: int, max_retries: int = DEFAULT_RETRIES) -> None:
        self.workers, self.max_retries = workers, max_retries
        self._pool: ProcessPoolExecutor | None = None
        self._size = 0

    def _shared_pool(self, jobs: int) -> ProcessPoolExecutor:
        """The kept pool, made (again) where there is none or it has fewer workers than
        ``jobs`` could use."""
        want = min(self.workers, jobs)
        if self._pool is None or self._size < want:
            self.close()
            self._pool = ProcessPoolExecutor(max_workers=want, initializer=_exit_with_parent,
                                             initargs=(os.getpid(),))
            self._size = want
        return self._pool

    def map(self, fn: JobFn, jobs: list[Job]) -> Iterator[tuple[int, Any]]:
        tries = [0] * len(jobs)
        lost: list[int] = []
        yield from self._shared(fn, jobs, list(range(len(jobs))), lost)
        todo = sorted(lost)
        while todo:
            lost = []
            yield from self._isolated(fn, jobs, todo, lost)
            for i in lost:  # each ran alone: its own worker died
                tries[i] += 1
                if tries[i] > self.max_retries:
                    raise WorkerLostError(f"job {i}: its worker process died "
                                          f"{tries[i]} times")
            todo = sorted(lost)

    def _shared(self, fn: JobFn, jobs: list[Job], todo: list[int], lost: list[int]
                ) -> Iterator[tuple[int, Any]]:
        """Run ``todo`` in one pool; the jobs a broken pool took down go to ``lost``."""
        if not todo:
            return
        pool = self._shared_pool(len(todo))
        try:
            futs = {pool.submit(_local_call, fn, *jobs[i]): i for i in todo}
            yield from _collect(futs, lost)
        except BaseException:  # Ctrl-C, or the caller stopped early: end the workers now
            self._pool = None
            _stop_workers([pool])
            raise
        if lost:  # the pool broke: the next map makes a new one
            self.close()

    def _isolated(self, fn: JobFn, jobs: list[Job], todo: list[int], lost: list[int]
                  ) -> Iterator[tuple[int, Any]]:
        """Run each of ``todo`` in its own one-process pool, ``workers`` pools at a time."""
        for k in range(0, len(todo), self.workers):
            pools = [ProcessPoolExecutor(max_workers=1, initializer=_exit_with_parent,
                                         initargs=(os.getpid(),))
                     for _ in todo[k:k + self.workers]]
            try:
                futs = {pool.submit(_local_call, fn, *jobs[i]): i
                        for pool, i in zip(pools, todo[k:k + self.workers], strict=True)}
                yield from _collect(futs, lost)
            except BaseException:  # Ctrl-C, or the caller stopped early: end the workers now
                _stop_workers(pools)
                raise
            finally:
                for pool in pools:
                    pool.shutdown()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()

    def stream(self, fn: JobFn) -> PoolStream:
        """Jobs handed in one at a time while others run, on the kept pool (``PoolStream``):
        a caller that learns its next jobs from earlier results keeps every worker busy."""
        return PoolStream(self, fn)

    def _abandon(self) -> None:
        """Interrupted: end the kept pool's workers now (``_stop_workers``)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            _stop_workers([pool])


class PoolStream:
    """``fn`` over jobs submitted while others run on a ``LocalPoolExecutor``'s kept pool.
    ``slots`` jobs in flight keep every worker busy; a caller that holds the rest back
    chooses, when a worker frees, which job runs next. A job whose pool broke runs again
    through ``LocalPoolExecutor.map`` (its retries: only a job whose own worker died is
    charged)."""

    def __init__(self, executor: LocalPoolExecutor, fn: JobFn) -> None:
        self._executor, self._fn = executor, fn
        self.slots = executor.workers
        self._running: dict[Any, tuple[Any, Job]] = {}  # future -> (key, job)

    def __len__(self) -> int:
        return len(self._running)

    def submit(self, key: Any, job: Job) -> None:
        pool = self._executor._shared_pool(self.slots)
        self._running[pool.submit(_local_call, self._fn, *job)] = (key, job)

    def stop(self) -> None:
        """Interrupted: drop the jobs in flight and end the workers now."""
        self._running = {}
        self._executor._abandon()

    def wait(self) -> list[tuple[Any, Any]]:
        """``(key, result)`` of at least one finished job (blocks; none when none runs)."""
        if not self._running:
            return []
        try:
            done, _ = wait(set(self._running), return_when=FIRST_COMPLETED)
            results, lost = [], []
            for f in done:
                key, job = self._running.pop(f)
                try:
                    results.append((key, f.result()))
                except BrokenProcessPool:
                    lost.append((key, job))
            if lost:  # the pool broke: every job still in it is lost too
                for f in list(self._running):
                    key, job = self._running.pop(f)
                    try:
                        results.append((key, f.result()))
                    except BrokenProcessPool:
                        lost.append((key, job))
                self._executor.close()
                for i, res in self._executor.map(self._fn, [job for _, job in lost]):
                    results.append((lost[i][0], res))
            return results
        except BaseException:  # Ctrl-C, or a job's own error: end the workers now
            self.stop()
            raise


def _collect(futs: dict, lost: list[int]) -> Iterator[tuple[int, Any]]:
    """``(index, result)`` of each future as it completes (ties in index order); the index
    of one that failed because its pool broke goes to ``lost``."""
    pending = set(futs)
    while pending:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for f in sorted(done, key=futs.__getitem__):
            try:
                res = f.result()
            except BrokenProcessPool:
                lost.append(futs[f])
                continue
            yield futs[f], res


# --- Ray ----------------------------------------------------------------------------------
_WORKER_TRACES: dict[str, Any] = {}  # per worker process: trace key -> Trace
_WORKER_LOADS = [0]  # traces this worker process fetched from the object store


def _ray_call(fn: JobFn, cfg: RunConfig, arg: Any, key: str, box: list) -> Any:
    """Runs in a Ray worker. ``box`` holds the trace's ObjectRef inside a list, so Ray passes
    the reference instead of resolving it for every task; the worker resolves it once."""

    def get_trace() -> Any:
        import ray

        trace = _WORKER_TRACES.get(key)
        if trace is None:
            trace = _WORKER_TRACES[key] = ray.get(box[0])
            _WORKER_LOADS[0] += 1
        return trace

    return fn(cfg, arg, get_trace)


def worker_trace_loads() -> int:
    """How many traces this worker process has loaded or fetched from Ray's object store
    (once per trace, not once per job)."""
    from sim.run import trace_loads

    return _WORKER_LOADS[0] + trace_loads()


def trace_key(cfg: RunConfig) -> str:
    from sim.run import trace_options

    return repr(trace_options(cfg))


def _need_ray() -> Any:
    try:
        import ray
    except ImportError:
        from sim.io import InputError

        raise InputError("--executor ray: the ray package is not installed; "
                         "pip install 'kvsim[ray]'") from None
    return ray


CONNECT_TIMEOUT_S = 5.0


def _probe(address: str) -> None:
    """Refuse, in one line and within ``CONNECT_TIMEOUT_S``, a Ray address where nothing
    listens: ``ray.init`` would retry for minutes with the sweep shown at 0/N."""
    from urllib.parse import urlsplit

    from sim.io import InputError

    url = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = url.hostname, url.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise InputError(f"--address {address}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = (f"no answer within {CONNECT_TIMEOUT_S:.0f} s" if isinstance(e, TimeoutError)
               else (e.strerror or str(e)).lower())
        raise InputError(f"--address {address}: cannot reach Ray at {host}:{port} ({why}); "
                         "start the cluster or check the address") from None


class RayExecutor:
    """Jobs as Ray tasks (one CPU each). ``address``: None starts a new local Ray for this
    executor (shut down by ``close``), even if a cluster runs on this machine; ``"auto"``,
    ``"HOST:6379"`` or ``"ray://HOST:10001"`` joins an existing cluster (an address where
    nothing listens is refused within ``CONNECT_TIMEOUT_S``). If Ray is already initialized in
    this process, that instance is used as is."""

    name = "ray"

    def __init__(self, address: str | None = None, max_retries: int = DEFAULT_RETRIES,
                 max_in_flight: int = 0) -> None:
        self.address, self.max_retries, self.max_in_flight = address, max_retries, max_in_flight
        self._started = False
        # trace key -> its ObjectRef, kept across maps: a plan's rounds put each trace once
        self._refs: dict[str, Any] = {}
        if address not in (None, "auto", "local"):
            _probe(address)  # before any work or progress bar

    def _init(self) -> Any:
        import logging

        ray = _need_ray()
        if not ray.is_initialized():
            try:
                # None: a new local Ray, as documented ("local"); Ray's own default would
                # join a cluster started earlier on this machine instead.
                ray.init(address=self.address or "local", include_dashboard=False,
                         logging_level=logging.WARNING, configure_logging=True)
            except ImportError as e:  # ray:// needs the Ray Client (ray[client]: grpcio)
                from sim.io import InputError

                raise InputError(f"--address {self.address}: the Ray Client is not installed "
                                 f"({e.name or e}); pip install 'kvsim[ray]'") from None
            except (ConnectionError, ValueError, RuntimeError) as e:
                from sim.io import InputError

                where = self.address or "a local Ray"
                raise InputError(f"--address {where}: cannot start or reach Ray: "
                                 f"{' '.join(str(e).split())}") from None
            self._started = True
        return ray

    def map(self, fn: JobFn, jobs: list[Job]) -> Iterator[tuple[int, Any]]:
        if not jobs:
            return
        from sim.run import load_run_trace

        ray = self._init()
        remote = ray.remote(num_cpus=1, max_retries=self.max_retries,
                            retry_exceptions=False)(_ray_call)
        refs = self._refs
        for cfg, _ in jobs:  # each distinct trace is loaded once, here, into the object store
            k = trace_key(cfg)
            if k not in refs:
                refs[k] = ray.put(load_run_trace(cfg))
        cap = self.max_in_flight or len(jobs)
        queue = list(range(len(jobs)))
        running: dict[Any, int] = {}
        while queue or running:
            while queue and len(running) < cap:
                i = queue.pop(0)
                cfg, arg = jobs[i]
                k = trace_key(cfg)
                running[remote.remote(fn, cfg, arg, k, [refs[k]])] = i
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                i = running.pop(ref)
                try:
                    res = ray.get(ref)
                except ray.exceptions.RayTaskError as e:  # the job raised: not retried
                    cause = getattr(e, "cause", None)
                    if isinstance(getattr(cause, "exit_code", None), int):
                        raise cause from None  # a user error: one line, as locally
                    raise
                except (ray.exceptions.WorkerCrashedError,
                        ray.exceptions.NodeDiedError) as e:
                    raise WorkerLostError(f"job {i}: its worker died more than "
                                          f"{self.max_retries} times ({type(e).__name__})") \
                        from None
                yield i, res

    def close(self) -> None:
        self._refs = {}
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


def _local(spec: ExecutorSpec) -> Executor:
    if spec.jobs > 1:
        return LocalPoolExecutor(spec.jobs, max_retries=spec.max_retries)
    return SerialExecutor()


def _ray(spec: ExecutorSpec) -> Executor:
    return RayExecutor(spec.address, max_retries=spec.max_retries,
                       max_in_flight=spec.jobs if spec.jobs > 1 else 0)


# ExecutorSpec.kind -> the executor it makes
EXECUTORS: Registry[Callable[[ExecutorSpec], Executor]] = Registry("executor")
EXECUTORS.register("local", _local)
EXECUTORS.register("ray", _ray)
