"""torchtitan components specialised for the GRT (metrics, validation)."""
