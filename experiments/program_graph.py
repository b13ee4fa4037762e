"""Draw an agent's program as the launcher sees it: one box per process (a unit), the nodes it
runs as threads inside, and an arrow from each node to every node whose handle it was given.
The picture on the README and the docs' front page is this script's, from the demo's program
with two actors:

    python experiments/program_graph.py --num-actors 2 --out docs/images/ppo-program.png
    python experiments/program_graph.py --agent apex --num-actors 3 --out apex.svg
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from typing import Any, Iterator

import jaxdist as jd
from jaxdist.agents.experiment import with_preset
from jaxdist.program import Handle

CONFIGS = {"ppo": "PPOConfig", "impala": "IMPALAConfig", "apex": "ApexConfig", "es": "ESConfig"}


def handle_targets(value: Any, seen: set[int] | None = None) -> Iterator[str]:
    """Names of the nodes whose handles `value` holds, at any depth (lists, dicts, dataclasses)."""
    seen = set() if seen is None else seen
    if isinstance(value, Handle):
        yield value.node_name
        return
    if id(value) in seen or isinstance(value, type):
        return
    seen.add(id(value))
    if isinstance(value, (list, tuple)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    elif dataclasses.is_dataclass(value):
        items = [getattr(value, field.name) for field in dataclasses.fields(value)]
    else:
        return
    for item in items:
        yield from handle_targets(item, seen)


def node_title(node: jd.Node) -> str:
    """What a node runs: its class or factory, a replay node's tables."""
    served = getattr(node, "cls", None)
    if served is not None:
        return getattr(served, "__name__", type(served).__name__).replace("sebulba_", "")
    return type(node).__name__.replace("Node", "").lower()


def describe(program: jd.Program) -> tuple[list[tuple[str, list[tuple[str, str]]]], list[tuple[str, str]]]:
    """Processes as (unit name, [(node name, title), ...]) and edges (from node, to node)."""
    processes, edges = [], []
    for _, unit in program.units():
        parts = getattr(unit, "nodes", [unit])
        processes.append((unit.name, [(part.name, node_title(part)) for part in parts]))
        for part in parts:
            for target in sorted(set(handle_targets(part.shipped_arguments()))):
                edges.append((part.name, target))
    return processes, edges


def draw(program: jd.Program, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    processes, edges = describe(program)
    # Processes go in columns by group, in the program's group order (actors left of a learner).
    groups: dict[str, list] = {}
    for name, parts in processes:
        groups.setdefault(jd.program.group_of(name), []).append((name, parts))
    columns = list(reversed(groups.values())) if "actor" in groups else list(groups.values())
    box_w, row_h, gap = 2.6, 0.45, 0.5
    where: dict[str, tuple[float, float]] = {}
    height = max(sum(len(parts) * row_h + 0.55 + gap for _, parts in column) - gap for column in columns)
    fig, ax = plt.subplots(figsize=(2.2 + 3.6 * len(columns), 0.6 + 0.9 * height))
    for col, column in enumerate(columns):
        x = col * (box_w + 1.6)
        y = height
        for name, parts in column:
            box_h = len(parts) * row_h + 0.55
            y -= box_h
            ax.add_patch(FancyBboxPatch((x, y), box_w, box_h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                        fc="#eef3fb", ec="#3a5a8c", lw=1.4))
            ax.text(x + 0.12, y + box_h - 0.22, f"process {name}", fontsize=9, color="#3a5a8c", va="center",
                    weight="bold")
            for row, (part, title) in enumerate(parts):
                cy = y + box_h - 0.55 - row * row_h - row_h / 2 + 0.05
                inner = len(parts) > 1
                label = f"{part.rsplit('/', 1)[-1]}: {title}" if inner else title
                ax.text(x + box_w / 2, cy, label, fontsize=10, ha="center", va="center",
                        bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="#7a8fb0", lw=0.8))
                where[part] = (x, cy)
            y -= gap
    for source, target in edges:
        if source not in where or target not in where:
            continue
        (sx, sy), (tx, ty) = where[source], where[target]
        if sx == tx:  # within a column: around the boxes' right side
            start, end, style = (sx + box_w - 0.3, sy), (tx + box_w - 0.3, ty), "arc3,rad=-0.5"
        else:
            start = (sx + box_w, sy) if tx > sx else (sx, sy)
            end = (tx, ty) if tx > sx else (tx + box_w, ty)
            style = "arc3,rad=0.05"
        ax.annotate("", xy=end, xytext=start,
                    arrowprops=dict(arrowstyle="-|>", color="#c0504d", lw=1.2, connectionstyle=style))
    ax.set_xlim(-0.3, len(columns) * (box_w + 1.6) - 1.3)
    ax.set_ylim(-0.3, height + 0.2)
    ax.axis("off")
    ax.set_title(f"program '{program.name}': boxes are processes, arrows are handles (caller -> server)",
                 fontsize=10)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=sorted(CONFIGS), default="ppo")
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--num-actors", type=int, help="default: the env's preset")
    parser.add_argument("--out", default="program.svg")
    args = parser.parse_args()
    module = importlib.import_module(f"jaxdist.agents.{args.agent}")
    overrides = {} if args.num_actors is None else {"num_actors": args.num_actors}
    config = with_preset(getattr(module, CONFIGS[args.agent]), args.env_id, module.PRESETS, **overrides)
    program = module.agent(config).topology().program
    draw(program, args.out)
    print(f"wrote {args.out}: {program}")


if __name__ == "__main__":
    main()
