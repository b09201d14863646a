"""The flags of what the process logs and how."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from respd.logs import LogFormat, LogLevel, LogSettings


class LogConfig(BaseModel):
    model_config = ConfigDict(title="Logging")

    log_level: LogLevel = Field(LogSettings.level, description="Log verbosity.")
    log_format: LogFormat = Field(
        LogSettings.format,
        description="Log line format: text, or json (one object per line: ts, level, logger, "
        "message, request_id, key). Either way each line names its request id and the "
        "caller's key label.",
    )
    log_prompts: bool = Field(
        LogSettings.prompts,
        description="Log each generation's prompt messages (user text) at info level. Off: "
        "no user text is logged.",
    )

    def log_settings(self) -> LogSettings:
        return LogSettings(self.log_level, self.log_format, self.log_prompts)
