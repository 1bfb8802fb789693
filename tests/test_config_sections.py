"""RunConfig in sections behind one flat vocabulary (issue 30): the flat names users write
map one to one onto section fields, and everything users see of a config (``config.json``,
sweep point ids) is what the flat config gave. The pinned digests were computed by the flat
``RunConfig`` (commit d73831c) for the random configs below; an engine's knob is drawn only
for its own engine (the other engine's knob off its default is now refused)."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import fields

import pytest

from sim.config import (
    DEFAULTS,
    FLAT,
    KNOBS,
    PD_FIELDS,
    CacheConfig,
    ConfigError,
    ContextConfig,
    FleetConfig,
    PDConfig,
    PolicyConfig,
    PoolConfig,
    RunConfig,
    SGLangKnobs,
    TrafficConfig,
    VllmKnobs,
)
from sim.sweep import point_id

# a menu of values per flat field (the first is its default); engine knobs by their engine
MENU = {
    "trace": ["synthetic:claude-code", "synthetic:codex?sessions=3", "synthetic:chat?sessions=2"],
    "select": [None, "top-requests:8"], "shared_prefix": [None, 4096, "auto"],
    "max_context": [None, 32768], "block_size": [64, 16], "gaps": ["recorded", "tool", "cap:5"],
    "lenient": [False, True], "sessions": [4, 2, 8], "replay": ["closed", "open"],
    "time_scale": [1.0, 0.5], "max_concurrency": [0, 3], "max_new_tokens": [None, 64],
    "model": ["qwen3-8b", "qwen3-32b"], "profile": [None, "h100-qwen3-8b"],
    "gpu_cache": [262144, 65536], "cpu_cache": [0, 65536], "tiering": ["unified", "hicache"],
    "swap_buffer": [1024, 2048], "hicache_write_policy": ["write_through", "write_back"],
    "hicache_load_threshold": [10, 20], "preset": [None, "sglang", "vllm", "penelope"],
    "scheduler": ["fcfs", "lpm"], "context": ["full", "drop:4", "trim:2"],
    "chunk_size": [8192, 4096], "max_running": [None, 16], "replicas": [1, 2, 4],
    "router": [None, "round-robin", "dynamo-kv"], "pool": [0, 1048576],
    "pool_bandwidth": [25.0, 10.0], "pool_write": ["write-through", "write-back"],
    "prefill_replicas": [0, 2], "decode_replicas": [0, 1], "pd_link": ["rdma-400", "ideal"],
    "pd_streaming": ["off", "layer"], "pd_rule": ["disagg", "dynamo"], "pd_prealloc": ["on", "off"],
    "seed": [0, 3], "trace_seed": [None, 1], "repeats": [1, 2], "slo": [None, "ttft=2s"],
    "debug_cache": [False, True],
}
SGLANG = {"checkpoint_chunks": [True, False], "clip_max_new_tokens": [4096, 1024],
          "new_token_ratio": [0.7, 0.5], "new_token_ratio_min": [0.098, 0.05],
          "new_token_ratio_decay_steps": [600, 100]}
VLLM = {"vllm_async": [True, False], "vllm_patch": ["none", "penelope", "continuum"]}


def random_flat(rng: random.Random) -> dict:
    """A flat config: each field kept at its default or drawn (about a third of them)."""
    engine = rng.choice(["sglang", "vllm"])
    out = {"engine": engine}
    for k, vals in {**MENU, **(SGLANG if engine == "sglang" else VLLM)}.items():
        if rng.random() < 0.3:
            out[k] = rng.choice(vals)
    return out


def flats(n: int = 200, seed: int = 30) -> list[dict]:
    rng = random.Random(seed)
    return [random_flat(rng) for _ in range(n)]


# (sha1 of json.dumps(cfg.to_dict()) in its order, point id) of flats(60), by the flat config
PINNED = [
    ("f1f0256041cb", "96639e84cf1c"), ("caa64f008167", "98d322c07f0d"),
    ("7709dbf4e5f2", "b2dff9f36df6"), ("6206bec02c44", "c04a4dab3f91"),
    ("d1879c03fdf3", "5ab2ffd07680"), ("a66e20c42e3a", "9af7ebedb1af"),
    ("f67f5971a228", "aa0260eeaf98"), ("5c22d37e88a0", "2bcfd5ef570e"),
    ("5c78c3a4ba16", "84943c6c133d"), ("865dc3ae41af", "6f8b2cb7677c"),
    ("8a7221fea46d", "a7a0934e05a4"), ("5db44c9c84db", "367c7d037542"),
    ("31c213e8ae78", "4dbd6a09e53f"), ("57e46e7f97c5", "45076e13ba7e"),
    ("6231dfd1b3fc", "ea1192871d4c"), ("e33be9b52921", "2b926cbb59f4"),
    ("25035f747a34", "d50aca993708"), ("c89b0189d81a", "f6e9878bbc3d"),
    ("c6aebf7e0ad1", "956bb5ed43b8"), ("5c38959a7e7f", "8f9e865fb478"),
    ("e51b1a2eef7a", "20581b9d710c"), ("f31d66d48d11", "8713bfce16ce"),
    ("909daa4f541a", "8abde8cc7651"), ("d945bb83ab50", "c1e4dbe7004c"),
    ("93adf4bb103b", "4aba28795bc8"), ("61d6c9cc7f4b", "14ad4230d692"),
    ("a4bb123520c0", "4bdec84383c7"), ("cf2595cb47a5", "b0bf35f2b368"),
    ("af0fe3406058", "0e5233d438dd"), ("5fc205501d62", "4f7cc7de380a"),
    ("94e11b85e849", "20283952e42f"), ("04bd7e27d0d7", "4c14c6cf79b5"),
    ("7ce5711d5c9c", "c4f5dfc4c88e"), ("be81611f59b0", "ef0fad189b08"),
    ("0ad8a8d308e2", "5dd7cb75da53"), ("cb8c30c22330", "93677becf0b5"),
    ("1ad80d44ff4b", "ea5883ab6d96"), ("15c55fa0b597", "ea64e2f99eb6"),
    ("82013f3d5a3f", "1d2b22bd2f97"), ("d4c7b6f185ad", "abdf5f8f0ddf"),
    ("38f02fff2fa0", "b0cf6e1a1a8f"), ("640fa9f81475", "1b1e0469e88c"),
    ("15a241304fda", "3246bb3dc65a"), ("9097db333390", "f48fa23ee400"),
    ("234bbbca81e8", "47648d8b3061"), ("d95b7d2cdb41", "a66bfacc565a"),
    ("b978f5f78ab1", "76c2402711c2"), ("9b5288794cc6", "e494f7813fdd"),
    ("84078fce2bbf", "1576112f22af"), ("8583e5240483", "62065703b0c2"),
    ("374fcb5bb6d3", "1ce0b2ad32fe"), ("fb0f7b4dec19", "cfefa7887837"),
    ("fccfd17c57ef", "7727de1d462c"), ("04f537f50789", "96902e697619"),
    ("b7b3b5a15939", "79342b6edc74"), ("cb79edfb18ff", "7ee690be7dd1"),
    ("46c1eb06e075", "032f0059f818"), ("08f9471b0dce", "da4cd7cec0f6"),
    ("c0ae283ebb64", "d4360be73f6a"), ("a2aca86c1ea0", "dc24184e2704"),
]


# config.json fields added since the digests were pinned (vLLM 0.34, issue 51; kv_dtype and
# hybrid_swa_memory, issue 54): left out of the digest, so the pin proves every other field is
# as before; their values are checked apart
ADDED = {"vllm_version": "0.34", "vllm_cache_aware_window": 0,
         "vllm_cache_aware_threshold": 0.5, "kv_dtype": "bf16", "hybrid_swa_memory": True}


def _config_digest(cfg: RunConfig) -> str:
    d = cfg.to_dict()
    assert {k: d.pop(k) for k in ADDED} == ADDED
    return hashlib.sha1(json.dumps(d, default=str).encode()).hexdigest()[:12]


def test_config_json_and_point_ids_are_the_flat_configs() -> None:
    got = [(_config_digest(c), point_id(c))
           for c in map(lambda f: RunConfig.from_flat(**f), flats(60))]
    assert got == PINNED


@pytest.mark.parametrize("flat", flats(40, seed=7))
def test_flat_to_sections_to_flat_round_trips(flat) -> None:
    cfg = RunConfig.from_flat(**flat)
    d = cfg.to_dict()
    for k, v in flat.items():
        if k in d:
            assert d[k] == v, k
        assert cfg.value(k) == v, k
    assert {k: cfg.value(k) for k in d if k in FLAT} == {k: v for k, v in d.items() if k in FLAT}
    # config.json leaves a PD fleet's fields out of an aggregated run (as it always did)
    kept = cfg if cfg.is_pd else cfg.with_fields(**{k: DEFAULTS[k] for k in PD_FIELDS})
    assert RunConfig.from_flat(**{k: v for k, v in d.items() if k in FLAT}) == kept
    assert list(cfg.flat()) == list(FLAT)  # config.json's order
    assert cfg.with_fields() == cfg


def test_default_config_json_is_the_flat_defaults() -> None:
    d = RunConfig().to_dict()
    assert {k: v for k, v in d.items() if k != "policy_label"} == {
        k: v for k, v in DEFAULTS.items() if k not in PD_FIELDS}
    assert d["policy_label"] == "penelope"


def test_every_flat_name_is_one_section_field_and_every_field_has_one_name() -> None:
    sections = {"traffic": TrafficConfig, "cache": CacheConfig, "policy": PolicyConfig,
                "context": ContextConfig, "fleet": FleetConfig, "pool": PoolConfig,
                "pd": PDConfig}
    want = {(s, f.name) for s, cls in sections.items() for f in fields(cls)}
    want |= {("engine", f.name) for k in KNOBS.values() for f in fields(k)} | {("engine", "name")}
    want |= {("run", f.name) for f in fields(RunConfig) if f.name not in sections
              and f.name != "engine"}
    assert len(set(FLAT.values())) == len(FLAT)  # one field per name
    assert set(FLAT.values()) == want  # and a name for every field
    assert set(KNOBS) == {"sglang", "vllm"}
    assert {f.name for f in fields(RunConfig)} == {*sections, "engine", "seed", "trace_seed",
                                                   "repeats", "slo", "debug_cache", "extra"}


def test_the_engine_is_its_knobs_type() -> None:
    assert RunConfig().engine == SGLangKnobs()
    cfg = RunConfig.from_flat(engine="vllm", chunk_size=4096, max_running=8, vllm_async=False)
    assert cfg.engine == VllmKnobs(chunk_size=4096, max_running=8, vllm_async=False)
    assert cfg.engine.name == cfg.value("engine") == "vllm"
    assert not hasattr(cfg.engine, "new_token_ratio")
    assert not hasattr(RunConfig().engine, "vllm_async")
    patched = RunConfig.from_flat(engine="vllm", vllm_patch="penelope")
    assert patched.engine_label == "vllm+penelope-patch" and cfg.engine_label == "vllm"


OTHER = [("sglang", k, v[1]) for k, v in VLLM.items()] + \
        [("vllm", k, v[1]) for k, v in SGLANG.items()]


@pytest.mark.parametrize("engine, knob, value", OTHER)
def test_a_knob_of_the_other_engine_is_refused_naming_field_and_owner(engine, knob,
                                                                      value) -> None:
    owner = "vllm" if engine == "sglang" else "sglang"
    msg = f"field {knob!r}: is a knob of the {owner} engine, not of {engine!r}"
    with pytest.raises(ConfigError, match=msg):
        RunConfig.from_flat(engine=engine, **{knob: value})
    with pytest.raises(ConfigError, match="sweep.yaml point 3: " + msg) as e:
        RunConfig.from_dict({"engine": engine, knob: value}, "sweep.yaml point 3")
    assert e.value.field == knob
    with pytest.raises(ConfigError, match=msg):
        RunConfig.from_flat(engine=engine).with_fields(**{knob: value})
    # at its default the flat config always held it: accepted, and nothing changes
    default = RunConfig.from_flat(engine=engine, **{knob: DEFAULTS[knob]})
    assert default == RunConfig.from_flat(engine=engine)
    assert default.to_dict() == RunConfig.from_flat(engine=engine).to_dict()


@pytest.mark.parametrize("raw, field, needle", [
    ({"sesions": 2}, "sesions", "unknown field"),
    ({"sessions": 0}, "sessions", "must be a positive integer"),
    ({"engine": "tgi"}, "engine", "tgi"),
    ({"engine": "vllm", "vllm_patch": "nope"}, "vllm_patch", "nope"),
    ({"engine": "vllm", "vllm_async": "maybe"}, "vllm_async", "must be on or off"),
    ({"chunk_size": 32}, "chunk_size", "at least one block"),
    ({"max_running": 0}, "max_running", ">= 1"),
    ({"pool_bandwidth": 5, "tiering": "other"}, "tiering", "must be one of"),
])
def test_from_dict_errors_name_the_field(raw, field, needle) -> None:
    with pytest.raises(ConfigError) as e:
        RunConfig.from_dict(raw, "f.yaml")
    assert e.value.field == field and needle in str(e.value)
    assert str(e.value).startswith(f"f.yaml: field {field!r}: ")


def test_with_fields_changes_flat_fields_in_their_sections() -> None:
    base = RunConfig.from_flat(trace="synthetic:chat?sessions=2", gpu_cache=65536,
                               new_token_ratio=0.5, chunk_size=4096)
    c = base.with_fields(sessions=2, pool=65536, replicas=2, context="drop:4", policy="tlru")
    assert (c.traffic.sessions, c.pool.size, c.fleet.replicas) == (2, 65536, 2)
    assert (c.context.strategy, c.policy.policy, c.cache.gpu_cache) == ("drop:4", "tlru", 65536)
    assert base.traffic.sessions == 4  # frozen: a new config
    # to vllm: the knobs both engines have stay, SGLang's own are left behind
    v = base.with_fields(engine="vllm")
    assert v.engine == VllmKnobs(chunk_size=4096)
    assert v.with_fields(engine="sglang").engine == SGLangKnobs(chunk_size=4096)
    with pytest.raises(TypeError, match="no field 'sesions'"):
        base.with_fields(sesions=2)


def test_value_reads_every_flat_name() -> None:
    cfg = RunConfig.from_flat(engine="vllm", pool=4096, context="trim:2", policy="tlru",
                              prefill_replicas=1, decode_replicas=1, seed=4)
    flat = cfg.flat()
    assert flat == {k: cfg.value(k) for k in FLAT}
    assert (flat["pool"], flat["context"], flat["policy"], flat["engine"]) == \
        (4096, "trim:2", "tlru", "vllm")
    assert flat["new_token_ratio"] == DEFAULTS["new_token_ratio"]  # SGLang's, as a default
    assert cfg.to_dict()["prefill_replicas"] == 1  # PD fields only for a PD fleet
    assert "prefill_replicas" not in RunConfig().to_dict()
