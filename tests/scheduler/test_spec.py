"""Header parsing and occurrence arithmetic (no broker)."""
from datetime import datetime

import pytest

from broker.scheduler.spec import Schedule, ScheduleError, cron_next, int_header, parse_amq, parse_delayed


def test_int_header_accepts_ints_and_digit_strings():
    assert int_header("h", 5) == 5
    assert int_header("h", b"300") == 300
    assert int_header("h", " 7 ") == 7
    assert int_header("h", 2.0) == 2


@pytest.mark.parametrize("value", [-1, "x", b"1.5", 1.5, True, None, [1], "-3"])
def test_int_header_refuses(value):
    with pytest.raises(ScheduleError) as exc:
        int_header("AMQ_SCHEDULED_DELAY", value)
    assert exc.value.header == "AMQ_SCHEDULED_DELAY"


def test_parse_delayed():
    assert parse_delayed({}) is None
    assert parse_delayed({"x-delay": 0}) is None
    assert parse_delayed({"x-delay": 1500}) == Schedule("delay", delay=1500)
    for bad in (-1, "abc", True):
        with pytest.raises(ScheduleError):
            parse_delayed({"x-delay": bad})


def test_parse_amq_combinations():
    assert parse_amq({}) is None
    assert parse_amq({"AMQ_SCHEDULED_DELAY": 0}) is None
    s = parse_amq({"AMQ_SCHEDULED_DELAY": 300, "AMQ_SCHEDULED_PERIOD": 200, "AMQ_SCHEDULED_REPEAT": 3})
    assert (s.delay, s.period, s.repeat, s.cron) == (300, 200, 3, None)
    c = parse_amq({"AMQ_SCHEDULED_CRON": b"*/5 * * * *"})
    assert c.cron == "*/5 * * * *"


@pytest.mark.parametrize("headers,named", [
    ({"AMQ_SCHEDULED_PERIOD": 100}, "AMQ_SCHEDULED_PERIOD"),
    ({"AMQ_SCHEDULED_REPEAT": 2}, "AMQ_SCHEDULED_REPEAT"),
    ({"AMQ_SCHEDULED_CRON": "bogus"}, "AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": "* * 32 * *"}, "AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": ""}, "AMQ_SCHEDULED_CRON"),
    ({"AMQ_SCHEDULED_CRON": 5}, "AMQ_SCHEDULED_CRON"),
])
def test_parse_amq_refuses(headers, named):
    with pytest.raises(ScheduleError) as exc:
        parse_amq(headers)
    assert exc.value.header == named


def test_delay_period_repeat_occurrences():
    s = Schedule("amq", delay=300, period=200, repeat=3)
    due, left, run = s.first(1000.0)
    seen = [due]
    while True:
        nxt = s.following(due, left, run, due)
        if nxt is None:
            break
        due, left, run = nxt
        seen.append(due)
    assert seen == pytest.approx([1000.3, 1000.5, 1000.7, 1000.9])


def test_cron_next_is_strictly_after():
    base = datetime(2030, 1, 1, 10, 0, 0).timestamp()
    assert cron_next("*/15 * * * *", base) == base + 15 * 60
    assert cron_next("*/15 * * * *", base + 1) == base + 15 * 60


def test_cron_run_does_delay_then_repeats_then_next_run():
    base = datetime(2030, 1, 1, 10, 0, 0).timestamp()
    s = Schedule("amq", delay=1000, period=2000, repeat=1, cron="*/10 * * * *")
    due, left, run = s.first(base)  # next cron time is 10:10
    assert run == base + 600 and due == base + 601 and left == 2
    due, left, run = s.following(due, left, run, due)
    assert due == base + 603 and left == 1
    due, left, run = s.following(due, left, run, due)
    assert run == base + 1200 and due == base + 1201 and left == 2


def test_cron_missed_runs_collapse():
    base = datetime(2030, 1, 1, 10, 0, 0).timestamp()
    s = Schedule("amq", cron="* * * * *")
    due, left, run = s.first(base)
    later = base + 3600 + 5  # broker was down an hour
    due2, _, _ = s.following(due, left, run, later)
    assert due2 == base + 3660  # the next minute after "now", not 60 catch-up runs
