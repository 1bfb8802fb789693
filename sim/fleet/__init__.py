"""A fleet: N replicas behind a router, on one SimPy clock (a layer ABOVE the engines)::

    session processes (sim.replay) --submit--> Fleet --route--> Replica 0 .. N-1
                                                 |                (each a full engine: its own
        Router (policies/routing.py)  <- RouterView               cache, tiers, scheduler,
          decides from BELIEFS only:       |                       eviction policy, recorder)
          cache view  (beliefs.py)    <----+--- KV events (stored/removed), lagged  <--+
          load view   (load.py)       <----+--- in-flight counts, scraped metrics   <--+

- ``beliefs``: what the router thinks each replica caches (approximate views it updates with
  what it routed; an exact index fed by KV events after a lag); ``radix``: SMG 1.13's tree.
- ``load``: router-local in-flight counts, scraped engine metrics, predicted active load
  (``active``: the prompts active on a replica, per branch point of their shared prefixes).
- ``kvevents``: the replicas' KV events (each cache's own queue, ``sim.kvcache.events``),
  drained in emission order to the exact index and the pool before they read.
- ``fleet``: routes each request, keeps the beliefs, measures belief against truth; reads the
  replicas only through public queries (``gpu_prefix_blocks``), drained events and their
  recorders' listener (``ReplicaSignals``: first admissions, first tokens).
- ``results``: what a fleet run adds to a run's result (its columns, tables, metrics; the
  pool's from ``pooltier``); ``sim.run`` builds the replicas and assembles the result.
  ``checks``: what a fleet config must hold before it runs (``fleet_problem``).
- ``pd``: a disaggregated fleet (``PDFleet``): a prefill pool (a ``Fleet`` of prefill-only
  engines behind the router), a decode pool, the links between them (FIFO queues) and the PD
  rule (``policies.pd_rules``) that pairs them; ``pd_run``: a disaggregated run's table and
  summary fields (docs/pd.md).

Engines know nothing of fleets. ``--replicas 1`` reproduces a single-server run exactly.
"""
