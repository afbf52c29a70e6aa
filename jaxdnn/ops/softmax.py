"""softmax ops (being written)."""

__all__: list[str] = []
