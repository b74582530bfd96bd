"""The server's page in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, selenium):
a person picks a photo and sees its hits as thumbnails, labelled as ``search --html`` labels them."""

import os
import shutil

import pytest

from cvs_jax.testing import serve_process
from cvs_jax.testing.image_folders import new_photo, photo_run

pytestmark = pytest.mark.slow
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1100,700",
)


def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("needs Chromium: apt-get install -y chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_a_picked_photo_shows_its_hits_as_thumbnails(tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chrome = browser()
    try:
        wd, _ = photo_run(tmp_path)
        port = serve_process.free_port()
        with open(tmp_path / "serve.log", "wb") as log:
            server = serve_process.start(wd, port, log)
            try:
                chrome.get(f"http://127.0.0.1:{port}/")
                assert "visual search" in chrome.title
                photo = new_photo(tmp_path / "query.png", "bee", seed=11)
                chrome.find_element(By.ID, "file").send_keys(os.path.abspath(photo))

                def thumbnails_loaded(b):
                    imgs = b.find_elements(By.CSS_SELECTOR, ".hit img")
                    loaded = "return arguments[0].complete && arguments[0].naturalWidth > 0"
                    return len(imgs) == 5 and all(b.execute_script(loaded, i) for i in imgs) and imgs

                thumbs = WebDriverWait(chrome, 120).until(thumbnails_loaded)
                assert all("/thumb/" in t.get_attribute("src") for t in thumbs)
                first = chrome.find_elements(By.CSS_SELECTOR, ".hit")[0].text
                assert "score" in first and "model of session 1" in first and "arrived in session 1" in first
                assert "answered by the model of session 1" in chrome.find_element(By.ID, "status").text
                chrome.save_screenshot(str(tmp_path / "page.png"))
            finally:
                serve_process.stop(server)
    finally:
        chrome.quit()
