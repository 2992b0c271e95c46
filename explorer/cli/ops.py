"""`explorer cost --ops`: one forward pass operator by operator (explorer.costs.operators), with
each op's FLOPs, bytes, intensity, time and bound at this machine's measured peaks or a chip's
(--chip, --tp); --json for the rows, --html FILE for the picture (explorer.plots.step)."""

from __future__ import annotations

from explorer.cli.common import cost_info, print_json, writable

FP8 = ("fp8", "float8", "e4m3", "float8_e4m3fn")


def _setup(args):
    """(info, shape, peaks, interconnect GB/s, where) for the flags; FP8 needs a chip that has it."""
    from explorer.costs import hardware, shape_of
    from explorer.costs.optime import check_tp, fp8_shape

    fp8 = str(args.dtype).lower() in FP8
    if fp8 and not args.chip:
        raise ValueError("--dtype fp8 is modelled on a chip only: add --chip (e.g. --chip h100)")
    dtype = "bfloat16" if fp8 or (args.chip and args.dtype == "auto") else args.dtype
    info = cost_info(args.model, args.device, dtype)
    shape = fp8_shape(shape_of(info)) if fp8 else None
    if args.chip:
        chip = hardware.chip_named(args.chip)
        peaks = hardware.chip_peaks(args.chip, "fp8" if fp8 else info.dtype)
        where = f"{args.tp} x {chip.name}" if args.tp > 1 else chip.name
        where += f" ({'fp8' if fp8 else peaks.dtype}, modelled from the datasheet)"
        link = chip.interconnect_gbps
    else:
        if args.tp != 1:
            raise ValueError("--tp needs --chip (this machine is one device)")
        peaks, chip, link = hardware.measure(args.device, info.dtype), None, None
        where = f"this {peaks.device} (measured peaks, {peaks.dtype})"
    check_tp(info.attention_heads, info.kv_heads, args.tp, link, args.chip or "this machine")
    return info, shape, peaks, link, where


def run_ops(args) -> int:
    from explorer.costs.operators import operators
    from explorer.costs.optime import summary, timed

    writable(args.html, "--html")
    writable(args.png, "--png")
    if args.png:
        _check_browser(args.png)
    info, shape, peaks, link, where = _setup(args)
    fed = args.context if args.no_cache else args.tokens_fed
    table = operators(info, batch=args.batch, tokens_fed=fed, context_len=args.context,
                      use_cache=not args.no_cache, logits_positions=1, kv_dtype=args.kv_dtype,
                      shape=shape)  # fmt: skip
    from explorer.costs import shape_of

    rows = timed(table, peaks, tp=args.tp, interconnect_gbps=link, shape=shape or shape_of(info))
    head = summary(table, rows)
    if args.html or args.png:
        _write_picture(args, rows, _title(table, where, "<br>"))
    if args.json:
        print_json({"model": info.name, "where": where, "tp": args.tp, **head, "rows": rows})
        return 0
    _print(table, rows, head, where)
    for path in (args.html, args.png):
        if path:
            print(f"  picture written to {path}")
    return 0


def _write_picture(args, rows, title: str) -> None:
    """The step drawn (explorer.plots.step) as an offline HTML page and/or a PNG of that page."""
    from explorer import plots
    from explorer.app.voila.browser import png_of_html

    html = plots.figure_html(plots.step_figure(rows, title=title))
    if args.html:
        with open(args.html, "w", encoding="utf-8") as fh:
            fh.write(html)
    if args.png:
        with open(args.png, "wb") as fh:
            fh.write(png_of_html(html))


def _check_browser(png: str) -> None:
    """Before any work: a PNG needs playwright and chromium (the browser tests' own)."""
    from explorer.app.voila.browser import browser_unavailable

    why = browser_unavailable()
    if why:
        raise ValueError(f"--png {png}: {why}; or save the --html page's picture from its camera")


def _title(table, where: str, sep: str = " ") -> str:
    return (
        f"{table.model}: one {table.phase} step op by op (B={table.batch}, fed {table.tokens_fed}, "
        f"context {table.context_len}){sep}on {where}"
    )


def _print(table, rows, head, where: str) -> None:
    print(_title(table, where) + "; all figures modelled")
    print(
        f"  {'op':<20} {'x':>4} {'GFLOP':>10} {'MB':>11} {'FLOP/B':>8} {'ms':>9} {'share':>6}  bound"
    )
    for r in rows:
        inten = "-" if r["intensity"] is None else f"{r['intensity']:.3g}"
        print(
            f"  {r['name']:<20} {r['count']:>4} {r['total_flops'] / 1e9:>10,.3f} "
            f"{r['total_bytes'] / 1e6:>11,.3f} {inten:>8} {r['time_s'] * 1e3:>9,.4f} "
            f"{100 * r['share']:>5.1f}%  {r['bound']}"
        )
    tops = ", ".join(f"{n} {t * 1e3:.3g} ms ({b})" for n, t, b in head["top"])
    print(
        f"  {head['ops_per_layer']} operators per layer; step {head['step_s'] * 1e3:.4g} ms as the "
        f"sum of the ops at the roofs (unfused); top three: {tops}"
    )
