"""MQTT 3.1/3.1.1: the sans-IO codec (the listener and the mapping to the routing core come next)."""
