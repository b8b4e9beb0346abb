"""Utilities every layer may use: progress bars, per-phase compile times, protobuf wire framing, post-import
hooks and the C toolchains."""
