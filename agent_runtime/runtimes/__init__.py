"""The runtime of each machine: one machine instance over the live objects it follows."""
