"""A worked example policy (docs/policies.md): Penelope's eviction, except that a history
whose reply ended in a tool call is held for ``hold_s`` seconds -- the tool usually
returns within seconds and the next request will want that history back."""

from policies import BLOCK, PRIVATE_HEAD, EvictionPolicy


class HoldToolCalls(EvictionPolicy):
    name = "hold-tool-calls"
    start, granularity = PRIVATE_HEAD, BLOCK  # free the front of private history, exactly
    hold_s: float = 10.0  # a parameter: --policy-param hold_s=30
    pins = True  # ask pinned_until() for each victim leaf
    events = frozenset({"reply"})  # on_reply() after every request

    def __init__(self, **params):
        super().__init__(**params)
        self.until: dict[int, float] = {}  # leaf serial -> end of its hold (sim seconds)

    def on_reply(self, event):
        if event.leaf is None:
            return
        if event.next_gap == "tool":
            self.until[event.leaf.serial] = event.time + self.hold_s
        else:
            self.until.pop(event.leaf.serial, None)

    def pinned_until(self, node):
        return self.until.get(node.serial, float("-inf"))
