"""``snlpgw lesson start DEVICE APP/TASK[/LESSON] | pause|resume|stop DEVICE``: a lesson
started, paused, resumed or stopped on a board like a parent or teacher would, through the
running gateway's admin API (:mod:`gateway.tasks.admin`; the same path as a control request on
``snlpgw/v1/ctl/{dev}``). Messages in zh-CN and English; the runtime's reply is printed as
JSON. Exit status 0 accepted, 1 refused or the gateway said no, 2 not reachable or bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from gateway.cli.admin_client import admin_call
from gateway.cli.subcommands import Subparsers

_DONE = {
    "start": ("课程已开始", "lesson started"),
    "pause": ("课程已暂停", "lesson paused"),
    "resume": ("课程已继续", "lesson resumed"),
    "stop": ("课程已停止", "lesson stopped"),
}


def add_lesson_commands(sub: Subparsers) -> None:
    lesson = sub.add_parser("lesson", help="start, pause, resume or stop a lesson on a device")
    lesson.add_argument("--admin-url", default=None, help="default: from the settings")
    actions = lesson.add_subparsers(dest="lesson_command", required=True)
    start = actions.add_parser("start", help="start a lesson: DEVICE APP/TASK[/LESSON]")
    start.add_argument("device", help="device id aa_bb_cc_dd_ee_ff")
    start.add_argument("lesson", help="APP/TASK or APP/TASK/LESSON (the task's first lesson)")
    start.add_argument(
        "--priority", type=int, choices=(1, 2, 3), default=3, help="1 voice, 2 scheduled, 3 parent"
    )
    start.set_defaults(func=_start)
    sync = actions.add_parser(
        "sync", help="put a lesson's audio on a board's SD card: DEVICE|--all APP/TASK[/LESSON]"
    )
    sync.add_argument(
        "target", nargs="+", help="DEVICE APP/TASK[/LESSON], or with --all the lesson"
    )
    sync.add_argument("--all", action="store_true", help="every online board")
    sync.set_defaults(func=_sync)
    for action in ("pause", "resume", "stop"):
        cmd = actions.add_parser(action, help=f"{action} the device's lesson")
        cmd.add_argument("device", help="device id aa_bb_cc_dd_ee_ff")
        cmd.add_argument("--instance", default=None, help="only if this instance is current")
        cmd.set_defaults(func=_control, action=action)


def parse_lesson(text: str) -> tuple[str, str, str | None] | None:
    """``app/task`` or ``app/task/lesson`` → its parts; None when it is neither."""
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else None


def _start(args: argparse.Namespace) -> int:
    named = parse_lesson(args.lesson)
    if named is None:
        sys.stderr.write(
            f"snlpgw lesson: 课程名应为 APP/TASK[/LESSON] / "
            f"the lesson is APP/TASK[/LESSON], not {args.lesson!r}\n"
        )
        return 2
    app_id, task_id, lesson_id = named
    body = {"app_id": app_id, "task_id": task_id, "lesson_id": lesson_id, "priority": args.priority}
    return _send(args, "start", body, "")


def _sync(args: argparse.Namespace) -> int:
    want = 1 if args.all else 2
    named = parse_lesson(args.target[-1]) if len(args.target) == want else None
    if named is None:
        sys.stderr.write(
            "snlpgw lesson sync: 用法 / usage: DEVICE APP/TASK[/LESSON] | --all APP/TASK[/LESSON]\n"
        )
        return 2
    app_id, task_id, lesson_id = named
    body = {"app_id": app_id, "task_id": task_id, "lesson_id": lesson_id}
    path = "/admin/lessons/sync" if args.all else f"/admin/devices/{args.target[0]}/lesson/sync"
    answer = admin_call(args, "POST", path, body)
    if answer.status is None:
        sys.stderr.write(f"snlpgw lesson: 无法连接网关 / {answer.problem}\n")
        return 2
    sys.stdout.write(json.dumps(answer.body, ensure_ascii=False) + "\n")
    reply = answer.body if isinstance(answer.body, dict) else {}
    if answer.status != 200:
        sys.stderr.write(
            f"snlpgw lesson: 网关拒绝 / the gateway said {answer.status}: {reply.get('detail', '')}\n"
        )
        return 1
    jobs = reply.get("jobs", [reply]) if args.all else [reply]
    failed = [j for j in jobs if j.get("state") != "done"] + list(reply.get("not_started", {}))
    for job in jobs:
        files = job.get("files", [])
        sent = sum(1 for f in files if f.get("state") == "done")
        skipped = sum(1 for f in files if f.get("state") == "skipped")
        sys.stderr.write(
            f"{job.get('device')}: {job.get('state')} {job.get('reason') or ''} — "
            f"已下载 {sent} 个, 未变 {skipped} 个 / {sent} downloaded, {skipped} unchanged\n"
        )
    return 1 if failed else 0


def _control(args: argparse.Namespace) -> int:
    query = f"?instance_id={args.instance}" if args.instance else ""
    return _send(args, args.action, None, query)


def _send(args: argparse.Namespace, action: str, body: object, query: str) -> int:
    path = f"/admin/devices/{args.device}/lesson/{action}{query}"
    answer = admin_call(args, "POST", path, body if body is not None else {})
    if answer.status is None:
        sys.stderr.write(f"snlpgw lesson: 无法连接网关 / {answer.problem}\n")
        return 2
    sys.stdout.write(json.dumps(answer.body, ensure_ascii=False) + "\n")
    reply = answer.body if isinstance(answer.body, dict) else {}
    if answer.status != 200:
        detail = reply.get("detail", "")
        sys.stderr.write(f"snlpgw lesson: 网关拒绝 / the gateway said {answer.status}: {detail}\n")
        return 1
    if reply.get("status") != "accepted":
        reason = reply.get("reason")
        sys.stderr.write(f"snlpgw lesson: 请求被拒绝 / refused: {reason}\n")
        return 1
    zh, en = _DONE[action]
    sys.stderr.write(f"{zh} / {en}: {reply.get('instance_id') or ''}\n")
    return 0
