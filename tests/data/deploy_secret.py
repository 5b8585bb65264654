"""A deploy that writes one secret (``SECRET_DEST`` on each host) the way the deploys write the
netrc and the Hugging Face token: :func:`servefleet.entry.steps.operations.put_secret`."""

import os

from servefleet.entry.steps.operations import put_secret

put_secret("Write a test secret", os.environ["SECRET_DEST"], os.environ["SECRET_VALUE"])
