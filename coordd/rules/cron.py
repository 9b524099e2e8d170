"""What is wrong with a cron expression, field by field (cronsim only says `Bad minute`).

coordd's schedules use five fields, minute hour day month weekday, in UTC
(coordd.service.workflows.check_cron); this names the field, its position, the value given and
what the field accepts.
"""

from __future__ import annotations

FIELDS = (
    ("minute", "minute", "0-59"),
    ("hour", "hour", "0-23"),
    ("day-of-month", "day of the month", "1-31"),
    ("month", "month", "1-12 or jan-dec"),
    ("day-of-week", "day of the week", "0-7 (0 and 7 are Sunday) or sun-sat"),
)
"""(cronsim's name, ours, the values it accepts) of each field, in order."""
FORMS = "a value, `*`, a list `1,5`, a range `1-5` or a step `*/15`"
ORDINALS = ("1st", "2nd", "3rd", "4th", "5th")


def field_problem(cron: str, cronsim_message: str) -> str:
    """`cronsim_message` (`Bad minute`) said as which field, the value given and the range
    it accepts; the message as it is when it names no field."""
    fields = cron.split()
    for i, (theirs, ours, values) in enumerate(FIELDS):
        if cronsim_message == f"Bad {theirs}" and i < len(fields):
            if theirs == "day-of-month" and fields[i].isdigit() and 1 <= int(fields[i]) <= 31:
                return (f"the day of the month field (3rd) is {fields[i]!r}, a day no month "
                        f"given in the 4th field ({fields[3]!r}) has")
            return (f"the {ours} field ({ORDINALS[i]}) is {fields[i]!r}; it takes {values}: "
                    f"{FORMS}")
    return cronsim_message
