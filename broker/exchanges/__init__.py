"""Exchange types: one module each, registered here by type name."""
from .base import Binding, Exchange
from .direct import DirectExchange
from .fanout import FanoutExchange
from .headers import HeadersExchange
from .topic import TopicExchange

EXCHANGE_TYPES: dict[str, type[Exchange]] = {
    cls.type_name: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)
}


def register_exchange_type(cls: type[Exchange]) -> None:
    EXCHANGE_TYPES[cls.type_name] = cls


__all__ = ["Binding", "Exchange", "EXCHANGE_TYPES", "register_exchange_type", "DirectExchange",
           "FanoutExchange", "HeadersExchange", "TopicExchange"]

from .delayed import DelayedMessageExchange  # noqa: E402  (x-delayed-message, issue 4)
register_exchange_type(DelayedMessageExchange)
