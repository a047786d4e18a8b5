"""Unit tests of the sans-IO AMQP layer (broker/amqp): no sockets, no trio.

Makes ``sansio_helpers`` importable whatever pytest's import mode is.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
