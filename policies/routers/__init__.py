"""The field's routers: each module holds one system's decision rule as pure functions of
the router's beliefs (tested against hand-computed cases), and its router plug-in."""
