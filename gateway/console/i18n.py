# ruff: noqa: RUF001  # Chinese texts use Chinese (full-width) punctuation on purpose
"""The console's two languages: zh-CN (the families') and English.

A pure core: which language a request gets (its ``lang`` cookie, else its ``Accept-Language``,
else zh-CN) and every text a page shows, in both languages. A key missing from the table is a
programming error (``KeyError`` in the tests), never a blank on a page.
"""

from __future__ import annotations

LANGS = ("zh-CN", "en")
DEFAULT_LANG = "zh-CN"

# key: (zh-CN, en)
MESSAGES: dict[str, tuple[str, str]] = {
    "app_title": ("学习音箱控制台", "Learning speaker console"),
    "skip": ("跳到正文", "Skip to content"),
    "language": ("语言", "Language"),
    "login": ("登录", "Log in"),
    "logout": ("退出", "Log out"),
    "username": ("用户名", "User name"),
    "password": ("密码", "Password"),
    "login_failed": ("用户名或密码不对。", "Wrong user name or password."),
    "login_limited": (
        "尝试次数太多，请一分钟后再试。",
        "Too many attempts: try again in a minute.",
    ),
    "signed_in_as": ("当前用户", "Signed in as"),
    "role_parent": ("家长", "Parent"),
    "role_teacher": ("老师", "Teacher"),
    "role_operator": ("运维", "Operator"),
    "home": ("首页", "Home"),
    "my_devices": ("我的设备", "My devices"),
    "no_devices": (
        "还没有设备。请让运维用 snlpgw user add 添加。",
        "No devices yet: an operator adds them with snlpgw user add.",
    ),
    "device": ("设备", "Device"),
    "child": ("孩子", "Child"),
    "progress": ("学习进度", "Progress"),
    "steer": ("控制课程", "Steer a lesson"),
    "fleet": ("设备总览", "Fleet"),
    "progress_plot": ("每课完成的句数（按时间）", "Sentences done per lesson over time"),
    "no_history": ("还没有学习记录。", "No lessons yet."),
    "history": ("学习记录", "Lessons"),
    "lesson": ("课程", "Lesson"),
    "started": ("开始时间", "Started"),
    "state": ("状态", "State"),
    "steps_done": ("完成句数", "Sentences done"),
    "step": ("句", "Step"),
    "signals": ("行为信号", "Behaviour signals"),
    "signals_note": (
        "反应时间：收音开始到孩子开口的毫秒数；"
        "走完：这一句做到了最后并有识别文本（1 是，0 否）。只是数字，不是评价。",
        "Response time: milliseconds from the listening window opening to the child starting to "
        "speak; run to the end: the step ran to its end with a transcript (1 yes, 0 no). "
        "Numbers only, not a judgement.",
    ),
    "sig_answered": ("开口句数", "Steps answered"),
    "sig_run_to_end": ("走完句数", "Steps run to the end"),
    "sig_mean_ms": ("平均反应时间（毫秒）", "Mean response time (ms)"),
    "sig_median_ms": ("反应时间中位数（毫秒）", "Median response time (ms)"),
    "response_ms": ("反应时间（毫秒）", "Response time (ms)"),
    "run_to_end": ("走完", "Run to the end"),
    "reference": ("原句", "Reference"),
    "transcript": ("识别文本", "Transcript"),
    "numbers": ("数值", "Numbers"),
    "recording": ("录音", "Recording"),
    "reference_clip": ("原声", "Reference clip"),
    "no_recording": ("没有录音", "No recording"),
    "no_clip": ("没有原声", "No clip"),
    "recording_note": (
        "录音链接几分钟后失效，刷新页面即可重新播放。",
        "Recording links expire after a few minutes: reload the page to play again.",
    ),
    "export": ("导出", "Export"),
    "export_json": ("导出 JSON", "Export JSON"),
    "export_csv": ("导出 CSV", "Export CSV"),
    "details": ("详情", "Details"),
    "no_numbers": ("无", "none"),
    "not_assessed_busy": (
        "当时未评测：网关繁忙，录音已保存",
        "Not assessed at the time: the gateway was busy; the recording is kept",
    ),
    "assessed_later": (
        "课后按录音补评（当时网关繁忙）",
        "Assessed later from the recording (the gateway was busy)",
    ),
    "state_running": ("进行中", "running"),
    "state_paused": ("已暂停", "paused"),
    "state_completed": ("已完成", "completed"),
    "state_cancelled": ("已停止", "stopped"),
    "start": ("开始", "Start"),
    "pause": ("暂停", "Pause"),
    "resume": ("继续", "Resume"),
    "stop": ("停止", "Stop"),
    "choose_lesson": ("选择课程", "Choose a lesson"),
    "sent": ("指令已发送。", "Request sent."),
    "send_failed": ("指令未能发送，请稍后再试。", "The request could not be sent: try again."),
    "live": ("实时进度", "Live progress"),
    "live_waiting": ("等待课程开始……", "Waiting for a lesson to start…"),
    "priority_note": (
        "家长的指令优先级最高（3），会打断正在进行的其他课程。",
        "A parent's request has the highest priority (3): it interrupts any other lesson.",
    ),
    "online": ("在线", "Online"),
    "offline": ("离线", "Offline"),
    "firmware": ("固件", "Firmware"),
    "rssi": ("信号 (RSSI)", "Signal (RSSI)"),
    "sd_free": ("SD 剩余", "SD free"),
    "current_lesson": ("当前课程", "Current lesson"),
    "last_seen": ("最后在线", "Last seen"),
    "alarms": ("告警", "Alarms"),
    "not_reported": ("未上报", "not reported"),
    "heap": ("可用内存", "Free heap"),
    "xiaozhi": ("小智设备", "Xiaozhi device"),
    "features": ("功能", "Features"),
    "mcp_tools": ("MCP 工具", "MCP tools"),
    "content": ("课程内容", "Lesson content"),
    "app": ("应用", "App"),
    "task": ("任务", "Task"),
    "resources": ("音频文件", "Audio files"),
    "missing": ("缺少的文件", "Missing files"),
    "none": ("无", "none"),
    "no_content": ("目录里没有课程。", "The catalog has no lessons."),
    "sync": ("同步到设备", "Sync to board"),
    "sync_lesson": ("要同步的课程", "Lesson to sync"),
    "sync_job": ("同步进度", "Sync progress"),
    "sync_none": ("未同步过", "never synced"),
    "sync_files": ("个文件", "files"),
    "sync_started": ("同步已开始。", "Sync started."),
    "sync_refused": ("同步未能开始：", "Sync not started: "),
    "job_running": ("同步中", "syncing"),
    "job_done": ("已完成", "done"),
    "job_failed": ("失败", "failed"),
    "job_refused": ("被拒绝", "refused"),
    "approvals": ("设备激活审批", "Device activation approvals"),
    "no_pending": ("没有待审批的设备。", "No device is waiting for approval."),
    "code": ("激活码", "Code"),
    "expires_in": ("剩余秒数", "Expires in (s)"),
    "approve": ("批准", "Approve"),
    "approved": ("已批准。", "Approved."),
    "approve_failed": ("批准失败：", "Approval failed: "),
    "ota_off": ("本网关不提供 OTA。", "This gateway serves no OTA."),
    "approve_code_label": ("输入设备上显示的 6 位激活码", "The 6-digit code the device shows"),
    "not_found": ("没有这个页面。", "No such page."),
    "forbidden_csrf": (
        "表单已过期，请刷新页面后重试。",
        "The form has expired: reload the page and try again.",
    ),
    "server_busy": ("数据暂时读不到，请稍后再试。", "The data cannot be read now: try again."),
}


def text(key: str, lang: str) -> str:
    zh, en = MESSAGES[key]
    return en if lang == "en" else zh


def negotiate(cookie: str | None, accept_language: str | None) -> str:
    """The ``lang`` cookie when it names a language we have; else the first of the browser's
    languages (by quality) that is Chinese or English; else zh-CN."""
    if cookie in LANGS:
        return str(cookie)
    ranked: list[tuple[float, int, str]] = []
    for position, part in enumerate((accept_language or "").split(",")[:32]):
        tag, _, params = part.strip().partition(";")
        quality = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                quality = float(params[2:])
            except ValueError:
                quality = 0.0
        ranked.append((-quality, position, tag.strip().lower()))
    for negative_q, _, tag in sorted(ranked):
        if negative_q >= 0:
            continue  # q=0: "not this one"
        if tag == "zh" or tag.startswith("zh-"):
            return "zh-CN"
        if tag == "en" or tag.startswith("en-"):
            return "en"
    return DEFAULT_LANG
