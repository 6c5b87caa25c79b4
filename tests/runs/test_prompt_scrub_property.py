"""A run's scrub keeps the operator's prompt and the fence nonce out of what it stores, and
nothing else: an answer that repeats a briefing line (an earlier run's excerpt) is kept verbatim.

Properties over random operator prompts, briefings and answers made of their lines and other text.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memactors.agents.prompt import compose_prompt
from memactors.agents.run_watch import MIN_LINE, PromptScrub, RunWatch

AT = "2026-12-01T10:00:00.000000Z"
# Words, not random characters: the redactor would take a long random token for a secret, and what is
# checked here is the scrub alone.
WORD = st.sampled_from(["all", "tests", "pass", "no", "new", "issues", "fix", "the", "ledger", "run", "report",
                        "notes/ledger.md", "ok", "nightly", "build", "·", "-", "[prompt]", "nothing", "to", "do."])
LINE = st.lists(WORD, min_size=1, max_size=8).map(" ".join)
LINES = st.lists(LINE, min_size=1, max_size=6)


def prompt_lines(prompt: str) -> set[str]:
    return {ln.strip() for ln in prompt.splitlines() if len(ln.strip()) >= MIN_LINE}


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, str, str]:
    prompt = "\n".join(draw(LINES))
    briefing = "\n".join(draw(LINES))
    composed = compose_prompt(briefing, prompt)
    nonce = composed.split('nonce="', 1)[1].split('"', 1)[0]
    pieces = draw(st.lists(st.one_of(st.sampled_from(prompt.splitlines()), st.sampled_from(briefing.splitlines()),
                                     LINE, st.just(nonce), st.just(composed)), min_size=1, max_size=6))
    joiner = draw(st.sampled_from(["\n", " ", ""]))
    return prompt, composed, nonce, joiner.join(pieces)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_nothing_of_the_operator_prompt_or_its_nonce_is_kept(case: tuple[str, str, str, str]) -> None:
    prompt, composed, nonce, answer = case
    kept = PromptScrub(prompt, composed).thorough(answer)
    assert nonce not in kept
    assert not [line for line in prompt_lines(prompt) if line in kept]


@settings(max_examples=150, deadline=None)
@given(cases())
def test_an_answer_without_the_operator_prompt_is_kept_verbatim(case: tuple[str, str, str, str]) -> None:
    prompt, composed, nonce, answer = case
    whole = len(prompt.strip()) >= MIN_LINE and prompt in answer  # the prompt echoed whole, its lines short
    if nonce in answer or whole or any(line in answer for line in prompt_lines(prompt)):
        return  # the other property's case
    assert PromptScrub(prompt, composed).thorough(answer) == answer


@settings(max_examples=150, deadline=None)
@given(LINES, LINES, st.data())
def test_an_answer_of_briefing_lines_is_kept_in_the_run_events(prompt_l: list[str], briefing_l: list[str],
                                                               data: st.DataObject) -> None:
    """The event path (a `command` agent's stdout lines, a claude text): a briefing line is kept, a line
    of the operator's prompt is `[prompt]`."""
    prompt, briefing = "\n".join(prompt_l), "\n".join(briefing_l)
    composed = compose_prompt(briefing, prompt)
    lines = prompt_lines(prompt)
    said = data.draw(st.lists(st.sampled_from([*briefing_l, *prompt_l]), min_size=1, max_size=5))
    watch = RunWatch(prompt, composed)
    for text in said:
        watch.note("text", AT, text=text)
    for text, event in zip(said, watch.events, strict=True):
        if text.strip() in lines:
            assert event["text"] == "[prompt]"
        elif not any(line in text for line in lines):
            assert event["text"] == text  # a briefing line, verbatim
        else:  # a briefing line that holds the whole (one-line) operator prompt: that part goes
            assert prompt.strip() not in event["text"]
