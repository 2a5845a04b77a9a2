#!/bin/sh
# Coverage is not collected in the offline build.
exit 0
