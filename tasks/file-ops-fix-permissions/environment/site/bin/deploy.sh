#!/bin/sh
echo deploying
