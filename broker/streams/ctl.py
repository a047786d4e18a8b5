"""``python -m broker ctl`` verbs for super streams, with ``rabbitmq-streams``' names and
options, over ``/api/stream/super-streams`` (``management/api_super_streams.py``)."""
from __future__ import annotations

from ..ctl import EX_DATAERR, Api, CtlError, Verb, q, register

# rabbitmq-streams add_super_stream's options and the queue arguments they set
_ARGS = {"max_length_bytes": "x-max-length-bytes", "max_age": "x-max-age",
         "stream_max_segment_size_bytes": "x-stream-max-segment-size-bytes",
         "leader_locator": "x-queue-leader-locator",
         "initial_cluster_size": "x-initial-cluster-size"}


def _size(text: str) -> int:
    """rabbitmq-streams takes sizes as 1000, 500mb, 2gb (decimal units)."""
    units = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "b": 1}
    low = text.strip().lower()
    for suffix, factor in units.items():
        if low.endswith(suffix) and low[:-len(suffix)].isdigit():
            return int(low[:-len(suffix)]) * factor
    if low.isdigit():
        return int(low)
    raise CtlError(f"invalid size: {text}", EX_DATAERR)


def add_super_stream(api: Api, a) -> None:
    if (a.partitions is None) == (a.binding_keys is None):
        raise CtlError("Specify --partitions or --binding-keys, not both.", EX_DATAERR)
    body: dict = {"partitions": a.partitions} if a.partitions is not None else {
        "binding_keys": a.binding_keys}
    arguments: dict = {}
    for opt, arg in _ARGS.items():
        value = getattr(a, opt)  # an argparse option, by the table's name
        if value is None:
            continue
        if opt in ("max_length_bytes", "stream_max_segment_size_bytes"):
            value = _size(value)
        arguments[arg] = value
    if arguments:
        body["arguments"] = arguments
    api.call("PUT", f"/stream/super-streams/{q(a.vhost)}/{q(a.name)}", body)


def delete_super_stream(api: Api, a) -> None:
    api.call("DELETE", f"/stream/super-streams/{q(a.vhost)}/{q(a.name)}",
             not_found=(f"super stream '{a.name}' in vhost '{a.vhost}' not found",
                        EX_DATAERR))


register(Verb("add_super_stream", "Adds a super stream (a direct exchange and its partition "
              "streams)", add_super_stream, [
                  ("name", {}), ("--partitions", {"type": int}),
                  ("--binding-keys", {"dest": "binding_keys"}),
                  ("--max-length-bytes", {"dest": "max_length_bytes"}),
                  ("--max-age", {"dest": "max_age"}),
                  ("--stream-max-segment-size-bytes",
                   {"dest": "stream_max_segment_size_bytes"}),
                  ("--leader-locator", {"dest": "leader_locator"}),
                  ("--initial-cluster-size", {"dest": "initial_cluster_size", "type": int})],
              vhost=True,
              banner=lambda a: "Adding a super stream ..."))
register(Verb("delete_super_stream", "Deletes a super stream", delete_super_stream,
              [("name", {})], vhost=True,
              banner=lambda a: "Deleting a super stream ..."))
