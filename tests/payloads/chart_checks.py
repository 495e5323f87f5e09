"""Read a written chart back: the PNG's size, and how much of it is drawn (not background)."""

from __future__ import annotations

from pathlib import Path

from llm_pipeline import charts


def read_png(path: Path, *, rows: int = 1) -> float:
    """Open the PNG, check it has the charts module's size for ``rows`` axes, return the inked fraction."""
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[:2] == (
        round(charts.ROW_HEIGHT_INCHES * rows * charts.DPI),
        charts.WIDTH_INCHES * charts.DPI,
    ), pixels.shape
    ink = float((pixels[..., :3].min(axis=-1) < 0.9).mean())
    assert ink > 0.01, f"{path} is blank"
    return ink


def line_data(axis) -> dict[str, list[tuple[float, float]]]:
    """Each labelled line of a matplotlib axis as (x, y) points."""
    return {line.get_label(): [tuple(map(float, p)) for p in line.get_xydata()] for line in axis.lines}
