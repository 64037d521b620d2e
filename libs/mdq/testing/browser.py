"""Headless Chromium for the console's browser tests and bench-console: Debian's ``chromium``
and ``chromium-driver``, driven by Selenium (a dev dependency, imported only here), with the
flags this machine's closed network needs. Nothing here downloads a browser."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

MISSING = (
    "the console's browser tests need Debian's chromium and chromium-driver "
    "(apt-get install chromium chromium-driver); .ci/run installs them"
)
"""What to say where Chromium or its driver is missing."""
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
"""Headless, as root, and never reaching out (the closed network refuses it, slowly)."""


def chromium_paths() -> tuple[str, str] | None:
    """Chromium and its driver, or None where either is missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def headless_chromium(user_data_dir: Path, *, window: str = "1300,1600") -> WebDriver:
    """A new headless Chromium with an empty profile in ``user_data_dir``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = chromium_paths()
    if paths is None:
        raise RuntimeError(MISSING)
    browser, driver = paths
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (*FLAGS, f"--window-size={window}", f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)
