"""Back to each host's last good state (used by `servefleet rollout` for failed hosts)."""

from servefleet.deploys import host_settings, rollback

rollback(settings=host_settings(), to="good")
