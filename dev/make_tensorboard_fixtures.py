#!/usr/bin/env python3
"""Known bytes of a TensorBoard event file, written by the tensorboard package's own writer
(RecordWriter: TFRecord framing with its masked CRC32Cs; event_pb2: the Event protobuf), for
test/test_tensorboard.cpp. Run from the repository root:

    pip install tensorboard && python3 dev/make_tensorboard_fixtures.py

Writes test/fixtures/tensorboard/events.out.tfevents.fixture: the file_version event, then two
scalar events (the second at step 0, where proto3 leaves the step out, and with a 0.0 value).
"""
import io
import os

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

OUT = "test/fixtures/tensorboard/events.out.tfevents.fixture"

EVENTS = [
    event_pb2.Event(wall_time=1700000000.5, file_version="brain.Event:2"),
    event_pb2.Event(wall_time=1700000001.25, step=7, summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag="critic/rewards/mean", simple_value=0.25),
        summary_pb2.Summary.Value(tag="actor/lr", simple_value=3e-4),
        summary_pb2.Summary.Value(tag="perf/gen_tokens_per_s", simple_value=123456.789),
    ])),
    event_pb2.Event(wall_time=1700000002.0, step=0, summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag="actor/pg_clipfrac_low", simple_value=0.0),
    ])),
]


def main():
    buf = io.BytesIO()
    w = RecordWriter(buf)
    for e in EVENTS:
        w.write(e.SerializeToString())
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(buf.getvalue())
    print("wrote", OUT, len(buf.getvalue()), "bytes")


if __name__ == "__main__":
    main()
