"""A broker process for the full-disk tests: the CLI's server on a data dir that may be a
small tmpfs, with the disk alarm's free-space limit at 0 (a few MiB of tmpfs are always
under the default 50 MiB, which would block publishers from the start).

``python -m tests.persistence.diskbroker PORT DATA_DIR STORE SEGMENT_SIZE CHECKPOINT_BYTES``
(STORE: ``journal`` or a SQLAlchemy URL).
"""
from __future__ import annotations

import logging
import os
import sys

import trio

from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.listeners.amqp import run_server
from broker.persistence import open_store


def main() -> None:
    port, data_dir, store_url, segment, ckpt = sys.argv[1:6]
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    journal = JournalSettings(segment_size=int(segment), checkpoint_bytes=int(ckpt))
    config = Config(host="127.0.0.1", port=int(port), data_dir=data_dir, store=store_url,
                    journal=journal, disk_free_limit=0)
    os.makedirs(data_dir, exist_ok=True)
    store = open_store(config.store, config.data_dir, config.flush, config.journal, config.sql)
    trio.run(run_server, Broker(config, store), config.host, config.port)


if __name__ == "__main__":
    main()
