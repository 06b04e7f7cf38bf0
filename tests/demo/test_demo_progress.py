"""What the demo prints while it serves its prompts when stderr is no terminal (a log, CI, a pipe): one
line a prompt served, where click's progress bar printed its label alone, a bare ``prompts`` line."""

from __future__ import annotations

from specdiff.demo.run import prompt_progress


def test_without_a_terminal_each_prompt_served_is_one_line(capsys):
    prompts, served, said = [[1, 2], [3], [4, 5, 6]], [], []
    with prompt_progress(prompts) as sending:
        for ids in sending:
            said += capsys.readouterr().err.splitlines()
            assert len(said) == len(served)  # each said once it was served, not before
            served.append(ids)
    said += capsys.readouterr().err.splitlines()
    assert served == prompts
    assert said == ["    prompt 1/3 served", "    prompt 2/3 served", "    prompt 3/3 served"]


def test_a_request_that_ends_the_sending_is_not_said_served(capsys):
    with prompt_progress([[1], [2], [3]]) as sending:
        for ids in sending:
            if ids == [2]:
                break  # the vLLM crash scenario stops at the request the server died on
    assert capsys.readouterr().err.splitlines() == ["    prompt 1/3 served"]
