"""Sliders for lab 2: how many conversations fit in one GPU as the model and context length change.

The arithmetic is the learner's own ``conversations_that_fit``; this module only supplies the
presets (published GPU memory sizes, model shapes from their config files) and draws the card's
memory as a bar: weights, the KV caches of the conversations that fit, and what is left over.
"""

from __future__ import annotations

from collections.abc import Callable

from labkit.sim.cost_model import MODELS, ModelSpec
from labkit.sim.hardware import GB, PRESETS

# The 70B model shows a model that does not fit one card at all; its shape is from its config.json.
MODEL_PRESETS: dict[str, ModelSpec] = {
    **{spec.name: spec for spec in MODELS.values()},
    "Llama 3.1 70B": ModelSpec("Llama 3.1 70B", 70_553_706_496, layers=80, kv_heads=8, head_dim=128),
}
CONTEXT_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 131072)

FitFunction = Callable[[float, float, int, int, float], int]


def capacity_table(fit: FitFunction, context_tokens: int = 8192, memory_fraction: float = 0.9) -> str:
    """Conversations that fit, for every model on every GPU preset, as aligned text."""
    gpus = list(PRESETS.values())
    header = f"{'model':<16}" + "".join(f"{gpu.name.replace('NVIDIA ', '')[:13]:>15}" for gpu in gpus)
    rows = [header]
    for name, spec in MODEL_PRESETS.items():
        counts = [
            fit(gpu.memory_bytes, spec.weight_bytes, int(spec.kv_bytes_per_token), context_tokens, memory_fraction)
            for gpu in gpus
        ]
        rows.append(f"{name:<16}" + "".join(f"{count:>15,}" for count in counts))
    return "\n".join(rows)


def draw_memory(
    ax,
    gpu_name: str,
    memory_bytes: float,
    weight_bytes: float,
    kv_per_conversation: float,
    conversations: int,
    memory_fraction: float,
) -> None:
    """One horizontal bar: weights, KV caches, unused, and the part of the card held back."""
    usable = memory_bytes * memory_fraction
    kv = conversations * kv_per_conversation
    parts = [
        ("weights", min(weight_bytes, memory_bytes), "tab:gray"),
        ("KV caches", kv, "tab:blue"),
        ("unused", max(0.0, usable - weight_bytes - kv), "white"),
        ("held back", memory_bytes - usable, "lightgray"),
    ]
    left = 0.0
    for label, size, colour in parts:
        ax.barh(0, size / GB, left=left / GB, color=colour, edgecolor="black", label=f"{label} ({size / GB:.1f} GB)")
        left += size
    ax.set_xlim(0, max(memory_bytes, weight_bytes) / GB)
    ax.set_yticks([])
    ax.set_xlabel("GB")
    ax.set_title(f"{gpu_name}: {conversations:,} conversations fit")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize=8)


def conversations_widget(fit: FitFunction):
    """Dropdowns for model and GPU, sliders for context length and memory fraction; redraws on change."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    model_box = widgets.Dropdown(options=list(MODEL_PRESETS), value="Llama 3.1 8B", description="model")
    gpu_box = widgets.Dropdown(
        options=[(gpu.name, key) for key, gpu in PRESETS.items()], value="h100-sxm", description="GPU"
    )
    context = widgets.SelectionSlider(options=CONTEXT_LENGTHS, value=8192, description="context")
    fraction = widgets.FloatSlider(value=0.9, min=0.5, max=0.95, step=0.05, description="memory used")
    output = widgets.Output()

    def redraw(_change=None) -> None:
        spec, gpu = MODEL_PRESETS[model_box.value], PRESETS[gpu_box.value]
        per_token = int(spec.kv_bytes_per_token)
        count = fit(gpu.memory_bytes, spec.weight_bytes, per_token, context.value, fraction.value)
        with output:
            output.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(8, 1.6))
            draw_memory(
                ax, gpu.name, gpu.memory_bytes, spec.weight_bytes, per_token * context.value, count, fraction.value
            )
            fig.tight_layout()
            plt.show()
            print(
                f"{spec.name}: {spec.weight_bytes / GB:.1f} GB of weights, {per_token / 1024:.0f} KiB of KV per "
                f"token, {per_token * context.value / GB:.2f} GB per {context.value:,}-token conversation"
            )

    for control in (model_box, gpu_box, context, fraction):
        control.observe(redraw, names="value")
    redraw()
    display(widgets.VBox([widgets.HBox([model_box, gpu_box]), widgets.HBox([context, fraction]), output]))
