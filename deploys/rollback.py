"""Back to each host's state before its last good deploy: `servefleet rollback INVENTORY`."""

from servefleet.deploys import host_settings, rollback

rollback(settings=host_settings())
