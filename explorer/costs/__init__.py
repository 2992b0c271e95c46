"""Why a step takes its time: bytes and FLOPs by named part (parts) over the model's
shape (shape), the machine's peaks (hardware), timing (one helper: measure / alternate) and noise
(one estimator, the interference measured).

from explorer import costs
costs.forward_cost(info, batch=1, tokens_fed=1, context_len=128)   # modelled, by part
costs.hardware.measure("cpu", "float32")                            # measured peaks
"""

from explorer.costs import hardware, split
from explorer.costs.parts import (
    BOUND_EXCLUDES,
    FAMILIES,
    PART_NOTES,
    ForwardCost,
    GenerationCost,
    Shape,
    bound_bytes,
    check_sizes,
    decode_knee,
    forward_bytes,
    forward_cost,
    forward_flops,
    generation_cost,
    generation_steps,
    parameter_bytes,
    parameter_counts,
    roofline,
    shape_of,
)
from explorer.costs.split import SPLIT_FIELDS, STEP_COST_FIELDS, step_roofline

__all__ = [
    "BOUND_EXCLUDES",
    "FAMILIES",
    "PART_NOTES",
    "SPLIT_FIELDS",
    "STEP_COST_FIELDS",
    "ForwardCost",
    "GenerationCost",
    "Shape",
    "bound_bytes",
    "check_sizes",
    "decode_knee",
    "forward_bytes",
    "forward_cost",
    "forward_flops",
    "generation_cost",
    "generation_steps",
    "hardware",
    "parameter_bytes",
    "parameter_counts",
    "roofline",
    "shape_of",
    "split",
    "step_roofline",
]
