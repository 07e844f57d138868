"""A device child that reads its requests and never answers (DeviceChild's timeout test)."""

import sys
import time

if __name__ == "__main__":
    for _line in sys.stdin:
        time.sleep(3600)
