"""Catalog loading: validation errors name file + path + problem; clamping; duplicates; demo."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.tasks.core import (
    CatalogError,
    catalog_check_main,
    check_catalog,
    load_catalog,
    resource_reader,
)
from gateway.tasks.core.catalog import clip_stem

from .helpers import LISTEN, REPEATER, SHADOWING

REPO = Path(__file__).parents[4]


def write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**base, **changes}


def lesson(**changes: Any) -> dict[str, Any]:
    return with_(SHADOWING, lessons=[{"lesson_id": "unit01", "clips": ["01.mp3"], **changes}])


def test_single_object_file_loads_sorted(tmp_path: Path) -> None:
    result = load_catalog(write(tmp_path, "a.json", SHADOWING))
    task = result.catalog.get("english_learning", "shadowing")
    assert task is not None
    assert task.lessons[0].clips == ("01.mp3", "02.mp3", "03.mp3", "04.mp3")
    assert (
        task.board_path(task.lessons[0], "01.mp3")
        == "/english_learning/shadowing/lessons/unit01/01.mp3"
    )
    assert task.min_window_ms is None  # the runtime setting applies
    assert task.lesson(None) is task.lessons[0]
    assert task.lesson("unit01") is task.lessons[0]
    assert task.lesson("nope") is None
    assert task.lessons[0].duration_ms("02.mp3") == 1000
    assert [str(w) for w in result.warnings] == [
        f"{tmp_path / 'a.json'}: $.lessons[0].clips: clips sorted"
    ]
    assert len(result.catalog) == 1
    assert result.catalog.get("x", "y") is None


def test_directory_of_files_and_arrays(tmp_path: Path) -> None:
    write(tmp_path, "a.json", [REPEATER, LISTEN])
    write(tmp_path, "b.json", lesson(clips=["01.mp3", "02.mp3", "03.mp3", "04.mp3"]))
    write(tmp_path, "notes.txt", "ignored")
    result = load_catalog(tmp_path)
    assert sorted(t.task_id for t in result.catalog) == ["listen", "repeater", "shadowing"]
    assert result.warnings == ()
    assert len(result.files) == 2


@pytest.mark.parametrize(("ratio", "clamped"), [(1.0, 1.2), (2.0, 1.5)])
def test_listen_ratio_out_of_range_is_clamped_with_a_warning(
    tmp_path: Path, ratio: float, clamped: float
) -> None:
    result = load_catalog(write(tmp_path, "a.json", [with_(REPEATER, listen_ratio=ratio)]))
    task = result.catalog.get("english_learning", "repeater")
    assert task is not None
    assert task.listen_ratio == clamped
    (warning,) = result.warnings
    assert warning.path == "$[0].listen_ratio"
    assert f"clamped to {clamped}" in warning.message


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        (with_(SHADOWING, interaction_mode="JUDGE"), "$.interaction_mode", "Input should be"),
        (with_(SHADOWING, extra_field=1), "$.extra_field", "Extra inputs"),
        (with_(SHADOWING, lessons=[]), "$", "at least one lesson"),
        (with_(SHADOWING, app_id="../etc"), "$.app_id", "pattern"),
        (with_(SHADOWING, listen_ratio=0), "$.listen_ratio", "greater than 0"),
        (lesson(clips=["01.mp3", "01.mp3"]), "$.lessons[0].clips", "duplicate clips: 01.mp3"),
        (lesson(clips=["a/b.mp3"]), "$.lessons[0].clips[0]", "pattern"),
        (lesson(transcripts={"09.mp3": "x"}), "$.lessons[0]", "transcripts keys name no clip"),
        (lesson(durations_ms={"01": 0}), "$.lessons[0].durations_ms.01", "greater than 0"),
        (lesson(clips=[]), "$", "lessons without clips: unit01"),
        (
            with_(SHADOWING, lessons=[SHADOWING["lessons"][0]] * 2),
            "$",
            "duplicate lesson_id: unit01",
        ),
    ],
)
def test_errors_name_file_path_and_problem(
    tmp_path: Path, data: dict[str, Any], path: str, fragment: str
) -> None:
    file = write(tmp_path, "bad.json", data)
    with pytest.raises(CatalogError) as info:
        load_catalog(file)
    (issue,) = info.value.issues
    assert issue.file == str(file)
    assert issue.path == path
    assert fragment in issue.message
    assert str(file) in str(info.value)


def test_errors_in_arrays_carry_the_index(tmp_path: Path) -> None:
    file = write(tmp_path, "a.json", [REPEATER, with_(LISTEN, listen_ms=0)])
    with pytest.raises(CatalogError) as info:
        load_catalog(file)
    assert [(i.path, str(i).startswith(str(file))) for i in info.value.issues] == [
        ("$[1].listen_ms", True)
    ]


def test_duplicate_task_across_files_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "a.json", REPEATER)
    write(tmp_path, "b.json", [REPEATER])
    with pytest.raises(
        CatalogError,
        match=r"b\.json: \$: duplicate task english_learning/repeater \(first in .*a\.json\)",
    ):
        load_catalog(tmp_path)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{not json", "cannot read JSON"), (b"\xff\xfe", "cannot read JSON")],
)
def test_unreadable_file(tmp_path: Path, content: str | bytes, fragment: str) -> None:
    file = tmp_path / "a.json"
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content)
    with pytest.raises(CatalogError, match=fragment):
        load_catalog(file)


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no such file"):
        load_catalog(tmp_path / "nope")
    with pytest.raises(CatalogError, match=r"no \*\.json task files"):
        load_catalog(tmp_path)


def test_sentence_count_mismatch_warns(tmp_path: Path) -> None:
    result = load_catalog(
        write(
            tmp_path,
            "a.json",
            [
                with_(
                    REPEATER,
                    lessons=[{"lesson_id": "u", "clips": ["01.mp3"], "sentences": ["a", "b"]}],
                )
            ],
        )
    )
    (warning,) = result.warnings
    assert (warning.path, warning.message) == (
        "$[0].lessons[0].sentences",
        "2 sentences for 1 clips",
    )


def test_resource_reader_reads_utf8_and_stays_inside(tmp_path: Path) -> None:
    (tmp_path / "res" / "a").mkdir(parents=True)
    (tmp_path / "res" / "a" / "01.txt").write_text("早上好", encoding="utf-8")
    (tmp_path / "res" / "a" / "02.txt").write_bytes(b"\xff")
    (tmp_path / "secret.txt").write_text("no")
    read = resource_reader(tmp_path / "res")
    assert read("a/01.txt") == "早上好"
    assert read("a/02.txt") is None
    assert read("a/03.txt") is None
    assert read("../secret.txt") is None


def test_demo_catalog_loads_and_uses_every_text_source() -> None:
    lines = check_catalog(REPO / "catalog", REPO / "catalog" / "resources")
    assert lines[-1].startswith("OK 5 tasks")  # + the 3 STEPS tasks of thinking_games.json
    joined = "\n".join(lines)
    for source in ("expected[transcripts]", "expected[txt_file]", "expected[sentences]"):
        assert source in joined
    assert "/english_learning/shadowing/lessons/unit01/04.mp3  expected[txt_file]" in joined
    demo = load_catalog(REPO / "catalog" / "english_learning.json").catalog
    repeater = demo.get("english_learning", "repeater")
    assert repeater is not None
    assert (repeater.interaction_mode, repeater.repeat) == ("PLAY_AUDIO", 3)


def test_catalog_check_main_exit_codes(tmp_path: Path) -> None:
    out = io.StringIO()
    assert catalog_check_main(REPO / "catalog", out=out) == 0
    assert "expected[sentences]" in out.getvalue()  # no resource dir: (b) is not consulted
    bad = write(tmp_path, "bad.json", with_(SHADOWING, lessons=[]))
    out = io.StringIO()
    assert catalog_check_main(bad, out=out) == 1
    assert out.getvalue().startswith(f"ERROR {bad}: $: Value error, a task needs")


def test_catalog_check_main_prints_to_stdout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    file = write(tmp_path, "a.json", with_(REPEATER, listen_ratio=9))
    assert catalog_check_main(file) == 0
    assert "WARNING" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("clip", "stem"), [("01.mp3", "01"), ("a.b.mp3", "a.b"), ("noext", "noext")]
)
def test_clip_stem(clip: str, stem: str) -> None:
    assert clip_stem(clip) == stem
