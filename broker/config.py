"""Broker settings, filled from the command line."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Config:
    host: str = "0.0.0.0"
    port: int = 5672
    data_dir: str = "./data"
    store: str | None = None  # None: the embedded journal
    flush: str = "sync"  # sync: fsync before confirm; async: periodic fsync
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    handshake_timeout: float = 10.0
    close_timeout: float = 3.0
    # RabbitMQ's vm_memory_high_watermark default: 0.4 of the machine's memory
    memory_high_watermark: float = 0.4
    memory_limit_bytes: int | None = None  # overrides the fraction when set
    disk_free_limit: int = 50 * 1024 * 1024
    log_level: str = "INFO"
