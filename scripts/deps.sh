#!/bin/bash
# (The project's copy of the shared device/deps.sh, with the line editor the REPL links,
# libjpeg-turbo and kuiper-server's cpp-httplib added.)
# Debian packages that the build needs, carried to the GPU machine (which reaches no registry).
#   here:            bash deps.sh download DIR     (fills DIR with .deb files; run apt-get update first)
#   on the GPU box:  source deps.sh install DIR    (unpacks them under /opt/deps, exports CMake/loader paths)
PKGS="libgoogle-glog-dev libgoogle-glog0v6 libgflags-dev libgflags2.2 libunwind-dev libunwind8
libutf8proc-dev libutf8proc2
libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libstb-dev libstb0
libjpeg62-turbo-dev libjpeg62-turbo
nlohmann-json3-dev libgtest-dev googletest
libedit-dev libedit2 libbsd0 libmd0
libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli-dev libbrotli1 zlib1g-dev"
case "$1" in
  download)
    mkdir -p "$2" && (cd "$2" && apt-get download $PKGS) ;;
  install)
    P=/opt/deps
    mkdir -p $P && for f in "$2"/*.deb; do dpkg -x "$f" $P; done
    # glog's CMake config looks for its FindUnwind module at a fixed path
    [ -e /usr/share/glog ] || ln -s $P/usr/share/glog /usr/share/glog
    export CMAKE_PREFIX_PATH=$P/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    export CPATH=$P/usr/include${CPATH:+:$CPATH}
    export LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
    export LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
  *) echo "usage: deps.sh download DIR | source deps.sh install DIR" >&2; false ;;
esac
