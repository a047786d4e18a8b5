"""Exchange types: one module each, registered here by type name."""
from .base import Binding, Exchange, ExchangeType
from .consistent_hash import ConsistentHashExchange
from .dedup import MessageDeduplicationExchange
from .delayed import DelayedMessageExchange
from .direct import DirectExchange
from .fanout import FanoutExchange
from .headers import HeadersExchange
from .topic import TopicExchange

EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    cls.type_name: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange,
                                   DelayedMessageExchange, ConsistentHashExchange,
                                   MessageDeduplicationExchange)
}


def register_exchange_type(cls: type[Exchange]) -> None:
    EXCHANGE_TYPES[cls.type_name] = cls


__all__ = [
    "EXCHANGE_TYPES",
    "Binding",
    "ConsistentHashExchange",
    "DelayedMessageExchange",
    "DirectExchange",
    "Exchange",
    "ExchangeType",
    "FanoutExchange",
    "HeadersExchange",
    "MessageDeduplicationExchange",
    "TopicExchange",
    "register_exchange_type",
]
