"""lmforge's self-contained HTML pages (layout, charts, number formatting)."""
