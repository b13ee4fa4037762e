"""A dependency-free line plot written as PNG (zlib + struct): for machines without matplotlib.

    line_plot("out.png", {"one server": ([1, 2, 4], [1.0, 1.4, 1.5])}, title=..., xlabel=..., ylabel=...)
    line_plot("curve.png", {"return": (env_steps, returns)}, log2_x=False)   # a learning curve

Text uses a 5x7 bitmap font (upper case, digits, a little punctuation). With ``log2_x`` (the
default) x is log2-scaled and every x value gets a tick, for sweeps over 1, 2, 4, ...; without
it x is linear with about six round ticks, for curves of many points.
"""

from __future__ import annotations

import math
import struct
import zlib

# 5x7 glyphs: five column bytes each, bit 0 at the top.
_FONT = {
    "0": "3e5149453e", "1": "00427f4000", "2": "4261514946", "3": "2141454b31", "4": "1814127f10",
    "5": "2745454539", "6": "3c4a494930", "7": "0171090503", "8": "3649494936", "9": "064949291e",
    "A": "7e1111117e", "B": "7f49494936", "C": "3e41414122", "D": "7f4141221c", "E": "7f49494941",
    "F": "7f09090901", "G": "3e4149497a", "H": "7f0808087f", "I": "00417f4100", "J": "2040413f01",
    "K": "7f08142241", "L": "7f40404040", "M": "7f020c027f", "N": "7f0408107f", "O": "3e4141413e",
    "P": "7f09090906", "Q": "3e4151215e", "R": "7f09192946", "S": "4649494931", "T": "01017f0101",
    "U": "3f4040403f", "V": "1f2040201f", "W": "3f4038403f", "X": "6314081463", "Y": "0708700807",
    "Z": "6151494543", " ": "0000000000", ".": "0060600000", "-": "0808080808", "(": "001c224100",
    ")": "0041221c00", "/": "2010080402", ":": "0036360000", ",": "0050300000", "=": "1414141414",
    "%": "2313086462", "+": "08083e0808",
}
COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, color: tuple[int, int, int], size: int = 1) -> None:
        for dy in range(size):
            for dx in range(size):
                px, py = x + dx, y + dy
                if 0 <= px < self.width and 0 <= py < self.height:
                    i = (py * self.width + px) * 3
                    self.pixels[i:i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color, size: int = 1) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for step in range(steps + 1):
            t = step / steps
            self.dot(round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t), color, size)

    def text(self, x: int, y: int, text: str, color=(0, 0, 0), scale: int = 1, vertical: bool = False) -> None:
        for n, char in enumerate(text.upper()):
            columns = bytes.fromhex(_FONT.get(char, _FONT[" "]))
            for cx, bits in enumerate(columns):
                for cy in range(7):
                    if bits >> cy & 1:
                        u, v = (n * 6 + cx) * scale, cy * scale
                        self.dot(x + v if vertical else x + u, y - u if vertical else y + v, color, scale)

    def save(self, path: str) -> None:
        rows = b"".join(b"\x00" + bytes(self.pixels[r * self.width * 3:(r + 1) * self.width * 3])
                        for r in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        with open(path, "wb") as png:
            png.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9))
                      + chunk(b"IEND", b""))


def _nice_step(span: float, ticks: int = 6) -> float:
    raw = span / ticks
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def _linear_ticks(low: float, high: float) -> list[float]:
    step = _nice_step((high - low) or 1.0)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _short(x: float) -> str:
    """1500 -> "1.5K", 2000000 -> "2M": tick labels that fit."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:g}{suffix}"
    return f"{x:g}"


def line_plot(path: str, series: dict[str, tuple[list[float], list[float]]], *, title: str = "",
              xlabel: str = "", ylabel: str = "", log2_x: bool = True, width: int = 720, height: int = 440) -> None:
    canvas = Canvas(width, height)
    left, right, top, bottom = 70, width - 180, 40, height - 55
    xs = [x for x_values, _ in series.values() for x in x_values]
    ys = [y for _, y_values in series.values() for y in y_values]
    fx = (lambda x: math.log2(x)) if log2_x else (lambda x: x)
    x_min, x_max = fx(min(xs)), fx(max(xs))
    low, high = min(0.0, min(ys)), max(0.0, max(ys))  # the axis spans 0 and every value, negative too
    step = _nice_step((high - low) or 1.0)
    y_min, y_max = step * math.floor(low / step), step * math.ceil(high / step)

    def px(x: float) -> int:
        return round(left + (fx(x) - x_min) / ((x_max - x_min) or 1) * (right - left))

    def py(y: float) -> int:
        return round(bottom - (y - y_min) / ((y_max - y_min) or 1) * (bottom - top))

    for i in range(int(round((y_max - y_min) / step)) + 1):  # grid and y ticks
        y = y_min + i * step
        canvas.line(left, py(y), right, py(y), (225, 225, 225))
        label = f"{y:g}"
        canvas.text(left - 8 - 6 * len(label), py(y) - 3, label)
    for x in sorted(set(xs)) if log2_x else _linear_ticks(min(xs), max(xs)):
        label = f"{x:g}" if log2_x else _short(x)
        canvas.line(px(x), bottom, px(x), bottom + 4, (0, 0, 0))
        canvas.text(px(x) - 3 * len(label), bottom + 8, label)
    canvas.line(left, top, left, bottom, (0, 0, 0))
    canvas.line(left, bottom, right, bottom, (0, 0, 0))
    canvas.text((left + right) // 2 - 6 * len(title), 12, title, scale=2)
    canvas.text((left + right) // 2 - 3 * len(xlabel), height - 22, xlabel)
    canvas.text(14, (top + bottom) // 2 + 3 * len(ylabel), ylabel, vertical=True)
    for n, (name, (x_values, y_values)) in enumerate(series.items()):
        color = COLORS[n % len(COLORS)]
        points = [(px(x), py(y)) for x, y in zip(x_values, y_values)]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            canvas.line(x0, y0, x1, y1, color, size=2)
        for x, y in points if len(points) <= 40 else ():  # markers only where they stay readable
            canvas.dot(x - 2, y - 2, color, size=5)
        canvas.line(right + 15, top + 10 + 18 * n, right + 35, top + 10 + 18 * n, color, size=2)
        canvas.text(right + 42, top + 7 + 18 * n, name)
    canvas.save(path)
