/* serve_wake.c - wakes the threads that send streams, on behalf of the
 * thread that generates.
 *
 * The batching scheduler hands every running sequence its token in turn,
 * on its one thread, between two forward passes. Waking the connection's
 * thread that waits for that token (pthread_cond_signal on a sleeping
 * thread) costs the caller a system call and an interrupt to another core:
 * 20-30 us a token on a loaded or virtualised machine, so 64 streams would
 * add more than a millisecond to every pass, a third of a GPU's pass. So
 * the token's callback only queues its job here (serve_waker_post) and this
 * thread signals it. The generation thread signals this one only when it
 * sleeps; while tokens keep coming, it signals whole lists of jobs, in
 * parallel with the next pass.
 *
 * A job is on the list at most once (its wake_posted flag, under its
 * mutex), and serve_waker_forget takes it off before the job's mutex goes:
 * it also waits while this thread is signalling a list that holds it. */
#include <stdlib.h>

#include "serve.h"

static void *waker_main(void *arg)
{
    serve_waker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->n_todo == 0 && !w->stop) {
            w->sleeping = true;
            pthread_cond_wait(&w->cv, &w->mu);
            w->sleeping = false;
        }
        if (w->n_todo == 0 && w->stop)
            break;
        /* Take the list; posts go on into the other one meanwhile. */
        serve_job **list = w->todo;
        w->todo = w->doing;
        w->doing = list;
        w->n_doing = w->n_todo;
        w->n_todo = 0;
        pthread_mutex_unlock(&w->mu);
        for (size_t i = 0; i < w->n_doing; i++)
            serve_job_wake(list[i]);
        pthread_mutex_lock(&w->mu);
        w->n_doing = 0;
        pthread_cond_broadcast(&w->done); /* serve_waker_forget may wait */
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

bool serve_waker_start(serve_waker *w, size_t capacity)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->done, NULL);
    /* Fixed lists: the waker reads one without the lock while posts fill
     * the other, so neither may move. */
    w->cap = capacity;
    w->todo = calloc(capacity ? capacity : 1, sizeof *w->todo);
    w->doing = calloc(capacity ? capacity : 1, sizeof *w->doing);
    w->running = w->todo && w->doing && pthread_create(&w->thread, NULL, waker_main, w) == 0;
    return w->running;
}

void serve_waker_stop(serve_waker *w)
{
    if (w->running) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        w->running = false;
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->done);
    free(w->todo);
    free(w->doing);
    w->todo = w->doing = NULL;
    w->cap = 0;
}

bool serve_waker_post(serve_waker *w, serve_job *j)
{
    if (!w->running)
        return false;
    pthread_mutex_lock(&w->mu);
    const bool room = w->n_todo < w->cap;
    if (room) {
        w->todo[w->n_todo++] = j;
        if (w->sleeping)
            pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return room; /* else the caller signals the job itself */
}

void serve_waker_forget(serve_waker *w, serve_job *j)
{
    if (!w->running)
        return;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->n_todo;)
        if (w->todo[i] == j)
            w->todo[i] = w->todo[--w->n_todo];
        else
            i++;
    for (;;) {
        bool held = false;
        for (size_t i = 0; i < w->n_doing && !held; i++)
            held = w->doing[i] == j;
        if (!held)
            break;
        pthread_cond_wait(&w->done, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}
