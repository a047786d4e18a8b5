"""STOMP 1.0, 1.1 and 1.2, sans-IO: the frame codec and the server's connection state."""
