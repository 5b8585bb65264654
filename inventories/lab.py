"""The local lab fleet (`servefleet lab up`): try every command here before a real fleet."""

from servefleet.lab.inventory import lab_inventory

globals().update(lab_inventory())
