"""Every check of a config before it runs: its own fields (``RunConfig.validate``), then what
its engine (``EngineBase.check``), its context strategy (``sim.context.context_problem``) and
its fleet (``sim.fleet.checks.fleet_problem``) say. The first problem is a ``ConfigError``
naming ``where`` and the field (exit status 2)."""

from __future__ import annotations

from sim.config import ConfigError, RunConfig
from sim.context import context_problem
from sim.engines import ENGINES
from sim.fleet.checks import fleet_problem


def check_rooms(cfg: RunConfig, where: str = "config") -> RunConfig:
    """What the engine, the context strategy and the fleet say of ``cfg`` (its own fields
    already valid)."""
    for ask in (ENGINES[cfg.engine.name].check, context_problem, fleet_problem):
        problem = ask(cfg)
        if problem is not None:
            raise ConfigError(where, *problem)
    return cfg


def check(cfg: RunConfig, where: str = "config") -> RunConfig:
    """``cfg`` when it can run; else the ConfigError of its first problem."""
    return check_rooms(cfg.validate(where), where)
