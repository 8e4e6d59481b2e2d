"""The tools: the ``agent-runtime`` CLI, diagram and table renderers, trace replay, the
table diff and the exhaustive exploration. Nothing in the production runtime imports them."""
