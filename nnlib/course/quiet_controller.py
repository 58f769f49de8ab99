"""The notebook cluster's controller configuration (``ipcontroller --config=<this file>``): no noise in the logs.

ipykernel 7 engines send an ``iopub_welcome`` message to every new subscriber of their output, and ipyparallel 9's
controller logs each one as the error "Monitor message without topic": this filter drops exactly that harmless error.
"""

import logging

LESSON = 0  # the course's own tools: any lesson may use them


class NoIopubWelcome(logging.Filter):
    """Drops the controller's "Monitor message without topic" records about ``iopub_welcome`` messages."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("Monitor message without topic" in text and "iopub_welcome" in text)


logging.getLogger("IPController").addFilter(NoIopubWelcome())
