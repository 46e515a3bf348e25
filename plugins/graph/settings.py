"""The settings the graph plugin reads (declared by its ``ascend_kernel_settings``).

``graph_mode`` itself (which mode) is a family-forcing name and stays in the
core's settings; these say what a capturing mode captures.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from ascend_kernel.settings import SizeList, parse_capture_sizes


class GraphSettings(BaseModel):
    graph_capture_sizes: SizeList = Field(
        None, description="Batch sizes (tokens) a capturing graph mode captures, comma separated; "
        "unset means the mode's default. Larger batches run eagerly.",
        json_schema_extra={"allowed": "comma-separated positive whole numbers (e.g. 1,2,4)"},
    )
    graph_capture_mode: Literal["auto", "piecewise", "full_decode_only"] = Field(
        "auto", description="What a capturing graph mode captures: 'piecewise' (attention runs between captured "
        "pieces; every batch up to the largest size) or 'full_decode_only' (uniform decode batches captured whole, "
        "attention inside; other batches run eagerly). 'auto': the mode's default (cpu-graph: piecewise; aclgraph: "
        "vLLM's cudagraph_mode).",
    )

    @field_validator("graph_capture_sizes", mode="before")
    @classmethod
    def _sizes(cls, value: Any) -> list[int] | None:
        return parse_capture_sizes(value)
