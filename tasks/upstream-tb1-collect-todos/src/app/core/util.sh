#!/bin/sh
# TODO: support macOS date
date +%F  # TODO: check TZ; TODO: check locale
