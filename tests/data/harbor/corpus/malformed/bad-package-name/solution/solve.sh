#!/bin/bash
set -e
true
