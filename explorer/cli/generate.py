"""explorer generate / speculate: step by step, one forward pass per token (or per round)."""

from __future__ import annotations

from explorer.cli.common import add_sampling_flags, print_json, sampling_of

ORDER = 30


def add(sub) -> None:
    _add_generate(sub)
    _add_speculate(sub)


def _add_generate(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate step by step, one forward pass per token, every step recorded"
    )
    p.add_argument(
        "--model",
        default=None,
        help="bundled:target (default), bundled:draft, arch:NAME, hub id or path",
    )
    p.add_argument("--prompt", default=None, help="the prompt text ('' starts from BOS)")
    p.add_argument(
        "--prompt-ids",
        default=None,
        metavar="IDS",
        help="comma-separated token ids instead of --prompt (for models without a tokenizer)",
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    add_sampling_flags(p)
    p.add_argument(
        "--no-cache", action="store_true", help="feed the whole sequence every step (no KV cache)"
    )
    p.add_argument("--top-n", type=int, default=20, help="most likely tokens recorded per step")
    p.add_argument("--no-roofline", action="store_true", help="skip measuring this machine's peaks")
    p.add_argument(
        "--json", action="store_true", help="print the Trace as JSON instead of the table"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_generate)


def _prompt_arg(args):
    if args.prompt_ids is not None:
        try:
            return [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError as err:
            raise ValueError(
                f"--prompt-ids must be comma-separated whole numbers, got {args.prompt_ids!r}"
            ) from err
    if args.prompt is None:
        raise ValueError("give --prompt TEXT (or --prompt-ids 1,2,3)")
    return args.prompt


def _cmd_generate(args) -> int:
    from explorer.engine.session import Session
    from explorer.model.loader import load

    sampling = sampling_of(args)
    prompt = _prompt_arg(args)
    lm = load(args.model, device=args.device, dtype=args.dtype)
    session = Session(
        lm,
        prompt,
        sampling,
        use_cache=not args.no_cache,
        top_n=args.top_n,
        max_new_tokens=args.max_new_tokens,
        roofline=not args.no_roofline,
    )
    if args.json:
        session.run()
        print(session.trace.to_json(indent=2))
        return 0
    print(
        f"{lm.info.name} on {session.device} ({lm.info.dtype}), cache {'off' if args.no_cache else 'on'}; "
        f"prob = final probability of the chosen token, entropy of the final distribution in nats"
    )
    print(
        f"{'step':>4}  {'phase':<7} {'fed':>4}  {'token':<16} {'prob':>7} {'entropy':>7} "
        f"{'latency ms':>10} {'KV bytes':>11}"
    )
    for st in session:
        token = repr(st.token_text)[:16] + ("*" if st.forced else "")
        print(
            f"{st.index:>4}  {st.phase:<7} {st.tokens_fed:>4}  {token:<16} {st.prob_final:>7.3f} "
            f"{st.entropy_final:>7.3f} {st.latency_s * 1e3:>10.2f} {st.kv_cache_bytes:>11,}"
        )
    print(f"stop: {session.stop_reason}")
    print(f"text: {session.text!r}")
    return 0


def _add_speculate(sub) -> None:
    p = sub.add_parser(
        "speculate", help="speculative decoding round by round: draft proposals, verdicts, residual"
    )
    p.add_argument(
        "--target", default="bundled:target", help="the model whose distribution is kept"
    )
    p.add_argument(
        "--draft", default="bundled:draft", help="the cheap proposer (same tokenizer as the target)"
    )
    p.add_argument("--prompt", default=None, help="the prompt text")
    p.add_argument(
        "--prompt-ids",
        default=None,
        metavar="IDS",
        help="comma-separated token ids instead of --prompt",
    )
    p.add_argument("--k", type=int, default=4, help="draft tokens proposed per round")
    p.add_argument(
        "--adaptive",
        action="store_true",
        help="grow k after a full acceptance, shrink after a rejection",
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    add_sampling_flags(p)
    p.add_argument(
        "--top-n", type=int, default=5, help="entries kept of each residual distribution"
    )
    p.add_argument(
        "--json", action="store_true", help="print rounds, tokens and statistics as JSON"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.set_defaults(func=_cmd_speculate)


def _cmd_speculate(args) -> int:
    from explorer.engine.drafts import check_k
    from explorer.engine.speculative import SpeculativeSession
    from explorer.model.loader import load

    check_k(args.k)
    sampling, prompt = sampling_of(args), _prompt_arg(args)
    target = load(args.target, device=args.device, dtype=args.dtype)
    draft = load(args.draft, device=args.device, dtype=args.dtype)
    session = SpeculativeSession(
        target,
        draft,
        prompt,
        sampling,
        k=args.k,
        top_n=args.top_n,
        max_new_tokens=args.max_new_tokens,
        adaptive=args.adaptive,
        record_steps=False,
    )
    if args.json:
        session.run(args.max_new_tokens)
        print_json(_speculate_record(session, target, draft))
        return 0
    print(
        f"target {target.info.name}, draft {draft.info.name} on {target.device} ({target.info.dtype}); "
        f"{'greedy' if sampling.is_greedy else 'sampling'}, k={args.k}{' adaptive' if args.adaptive else ''}"
    )
    print("a draft token is kept with probability min(1, p/q); + kept, x rejected, . not tested")
    print(f"{'round':>5} {'k':>2}  {'drafts':<44} {'emitted':<28} {'draft ms':>8} {'verify ms':>9}")
    _print_rounds(session)
    return 0


def _speculate_record(session, target, draft) -> dict:
    """`explorer speculate --json`: the models, the settings, the tokens, the stats, every round."""
    return {
        "target": target.info.name,
        "draft": draft.info.name,
        "prompt_ids": session.prompt_ids,
        "settings": session.trace.settings | {"draft_model": draft.info.name},
        "tokens": session.tokens,
        "text": session.text,
        "stop_reason": session.stop_reason,
        "stats": session.stats(),
        "rounds": [r.to_dict() for r in session.rounds],
    }


def _print_rounds(session) -> None:
    """Run the session round by round, one printed line each, then its stop, alpha and text."""
    for r in session:
        marks = {True: "+", False: "x", None: "."}
        drafts = " ".join(f"{marks[d['accepted']]}{d['text']!r}" for d in r.drafts)
        tail = "residual" if r.residual else "bonus"
        print(
            f"{r.index:>5} {r.k:>2}  {drafts[:44]:<44} {repr(''.join(r.texts))[:20]:<20} +{tail:<7} "
            f"{r.draft_s * 1e3:>8.2f} {r.verify_s * 1e3:>9.2f}"
        )
    st = session.stats()
    print(
        f"stop: {session.stop_reason}; {st['emitted']} tokens in {st['rounds']} rounds "
        f"({st['mean_tokens_per_round']:.2f} per round, {st['verify_passes']} target passes)"
    )
    if st["alpha"] is not None:
        print(
            f"alpha (accepted / tested) = {st['alpha']:.3f}, from the distributions sum min(p, q) = "
            f"{st['alpha_overlap']:.3f}; mean accepted {st['mean_accepted']:.2f}; accepted-length histogram "
            f"{st['accepted_histogram']}"
        )
    print(f"text: {session.text!r}")
