"""Models: T5 as pure functions (t5), checkpoint loading (checkpoints), presets and sharding."""
