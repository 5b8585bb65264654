"""The lab fleet (`servefleet lab up`): its own apt repository, package indexes, driver runfiles
and model store, all on the lab bridge. Read from the lab state, so this file names no address.
pyinfra loads every group_data file, so without a running lab this defines nothing."""

from servefleet.fleet.lab.groupdata import lab_group_data

globals().update(lab_group_data())
