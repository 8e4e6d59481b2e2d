"""The runtime of each machine: one machine instance over the live objects it follows; and
what every runtime takes its inputs through: the room facts (``room_events``), the routes
and links (``routing``) and the teardown runner (``teardown``)."""
