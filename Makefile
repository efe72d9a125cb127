# isthmus — every target a newcomer or CI needs. `make help` lists them.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/isthmus
export CARGO_TARGET_DIR ?= $(CURDIR)/target

.PHONY: help test unit kernel-test cluster-smoke demo deps

help:
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

test: unit kernel-test cluster-smoke ## the whole suite: unit and host-kernel tests, the stock-kernel rig, the cluster

unit: ## cargo tests of every crate (root: host-kernel datapath tests run in throwaway namespaces)
	cargo test --workspace --locked
