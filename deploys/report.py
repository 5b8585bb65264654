"""Used by `servefleet plan` and `servefleet status`: each host's summary, no operation."""

from servefleet.deploys import report

report()
