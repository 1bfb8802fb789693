"""A worked example policy (docs/policies.md): sub-agent histories first. A sub-agent's
history is rarely wanted again once its task is done (its result went back to the main agent,
which keeps its own history), so under pressure evict sub-agent histories before any main-agent
history; LRU within each group; Penelope's start and granularity."""

from policies import BLOCK, PRIVATE_HEAD, EvictionPolicy


class SubagentsFirst(EvictionPolicy):
    name = "subagents-first"
    start, granularity = PRIVATE_HEAD, BLOCK
    events = frozenset({"reply"})  # on_reply() tells whose history a leaf is

    def __init__(self, **params):
        super().__init__(**params)
        self.subagent_leaf: dict[int, bool] = {}  # leaf serial -> is a sub-agent's history

    def on_reply(self, event):
        if event.leaf is not None:  # context.sessions: the trace's sessions, read only
            session = self.context.sessions[event.session]
            self.subagent_leaf[event.leaf.serial] = session.is_subagent

    def key(self, node):
        main_agent = not self.subagent_leaf.get(node.serial, False)
        return (int(main_agent), node.last_access)  # sub-agents (0) before main agents (1)
