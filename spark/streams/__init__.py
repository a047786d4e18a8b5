"""Spark over TrioMQ streams: the ``triomq-stream`` data source (``source``) and the
synchronous Stream protocol client it reads with (``client``); see docs/streams.md."""
