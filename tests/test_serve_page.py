"""The chat page of bitnet serve in a real headless browser (Debian's
chromium through its driver and selenium; run by test_serve_page.sh): the
page loads and names the model, a message sent at temperature 0 streams
an answer into the page that equals the API's own answer to the same
message, Stop ends a long answer early, New chat clears the page. Every
wait is bounded. argv: base URL."""
import json
import sys
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

base = sys.argv[1]
message = "Who made the heaven and the earth?"
req = urllib.request.Request(
    base + "/v1/chat/completions",
    data=json.dumps({"messages": [{"role": "user", "content": message}], "max_tokens": 24,
                     "temperature": 0}).encode(),
    headers={"Content-Type": "application/json"})
want = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["message"]["content"]

opts = webdriver.ChromeOptions()
for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
    opts.add_argument(a)
opts.binary_location = "/usr/bin/chromium"
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
fails = 0


def check(ok, what):
    global fails
    if not ok:
        fails += 1
        print("FAIL:", what)


try:
    driver.set_page_load_timeout(30)
    driver.get(base + "/")
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.ID, "model").text not in ("", "loading…"))
    check(driver.find_element(By.ID, "model").text == "bitnet-kjv-7m-i2_s", "the page names the model")

    def set_value(elem_id, value):
        e = driver.find_element(By.ID, elem_id)
        e.clear()
        e.send_keys(value)

    def click(elem_id):  # through the page's own handler, wherever the button is laid out
        driver.execute_script(f"document.getElementById('{elem_id}').click()")

    set_value("temperature", "0")
    set_value("max-tokens", "24")
    set_value("input", message)
    click("send")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done='1']"))
    got = driver.find_element(By.CSS_SELECTOR, ".msg.assistant").text
    check(got == want.strip() or got == want, f"the streamed answer ({got!r}) equals the API's ({want!r})")
    check(driver.find_element(By.CSS_SELECTOR, ".msg.user").text == message, "the message is shown")

    # Stop: a long answer ends early. The page itself clicks Stop as soon
    # as the answer's first text shows: a round trip through the driver
    # can outlast the whole answer (the shipped model writes 400 tokens in
    # ~0.1 s). An answer that ends before the click cannot show it: up to
    # three tries.
    set_value("max-tokens", "400")
    set_value("temperature", "1")
    stopped = False
    for attempt in range(3):
        n = len(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"))
        set_value("input", "Tell me more.")
        driver.execute_script("""
            const n = arguments[0], box = document.getElementById('messages');
            const seen = new MutationObserver(() => {
                const answer = box.querySelectorAll('.msg.assistant')[n];
                if (answer && answer.textContent !== '') {
                    seen.disconnect();
                    document.getElementById('stop').click();
                }
            });
            seen.observe(box, {childList: true, subtree: true, characterData: true});
            document.getElementById('send').click();""", n)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == n + 1 and
                   d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[n].get_attribute(
                       "data-done") == "1")
        status = driver.find_element(By.ID, "status").text
        if status == "stopped":
            stopped = True
            break
        print(f"try {attempt + 1}: the answer ended by itself ({status!r})")
    check(stopped, "Stop stops the answer")

    click("new")
    check(driver.find_elements(By.CSS_SELECTOR, ".msg") == [], "New chat clears the page")
finally:
    driver.quit()
print(f"{'ok' if not fails else 'FAIL'}: page test, {fails} failed")
sys.exit(1 if fails else 0)
