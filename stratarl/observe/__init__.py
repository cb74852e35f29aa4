"""Cross-cutting observability: metrics, timers, loggers, trajectory traces, doctor, watchdog.

May be imported by every layer; imports none of them but `transport` (to read batches)."""
